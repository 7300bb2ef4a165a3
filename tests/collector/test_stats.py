"""Collector metrics: totals accumulate, interval measurements start afresh after each report."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from distrl_stream.collector.stats import CollectorStats, percentile
from distrl_stream.events import Termination


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50), st.floats(0, 1))
def test_percentile_matches_numpy_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-9)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 0.5))


def test_snapshot_reports_the_interval_and_keeps_totals() -> None:
    stats = CollectorStats()
    for inference, env in [(0.1, 1.0), (0.2, 2.0), (0.3, 3.0), (0.4, 4.0)]:
        stats.step(inference, env)
    stats.episode(Termination.SUCCESS, 1)
    stats.episode(Termination.TRUNCATED, 3)
    stats.abandon("e1")
    stats.published, stats.delivered, stats.produce_failures, stats.delivery_failures = 2, 1, 1, 1

    first = stats.snapshot(policy_version=3, in_flight=5, paused=False)
    assert first["success_rate"] == 0.5
    assert first["mean_episode_length"] == 2.0
    assert first["inference_latency_p50_s"] == pytest.approx(0.25)
    assert first["env_latency_p95_s"] == pytest.approx(3.85)
    assert first["episodes_success"] == 1 and first["episodes_truncated"] == 1 and first["episodes_env_error"] == 0
    assert first["episodes_total"] == 2 and first["abandoned"] == 1 and first["publish_failures"] == 2
    assert first["policy_version"] == 3 and first["in_flight"] == 5 and first["paused"] == 0
    assert first["episodes_per_min"] > 0 and first["steps_per_s"] > 0

    stats.episode(Termination.INFERENCE_ERROR, 0)
    second = stats.snapshot(policy_version=4, in_flight=0, paused=True, extra={"learner_version": 9.0})
    # No step in this interval: latency percentiles are left out rather than reported as 0 or NaN.
    assert "inference_latency_p50_s" not in second and second["steps_per_s"] == 0
    assert second["success_rate"] == 0.0 and second["mean_episode_length"] == 0.0
    assert second["episodes_total"] == 3 and second["episodes_inference_error"] == 1
    assert second["paused"] == 1 and second["learner_version"] == 9.0

    third = stats.snapshot(policy_version=4, in_flight=0, paused=False)
    assert "success_rate" not in third and third["episodes_per_min"] == 0 and third["episodes_total"] == 3
