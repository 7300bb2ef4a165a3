"""A collector's Prometheus metrics, scraped over HTTP."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from distrl_stream.collector.metrics import CollectorMetrics
from distrl_stream.collector.stats import CollectorStats
from distrl_stream.events import Termination
from distrl_stream.inference.client import Server
from distrl_stream.monitor.prometheus import RoleMetrics
from tests.monitor.scrape import scrape, serve, value

IDENTITY = {"run": "r1", "role": "collector", "source": "c-7"}


def test_collector_counts_are_read_from_its_stats_at_scrape_time(served: list[RoleMetrics]) -> None:
    stats = CollectorStats()
    pool = (
        Server("http://gpu-0:8000", httpx.AsyncClient(), adapters={3: "a" * 64, 4: "b" * 64}, requests=5),
        Server("http://gpu-1:8000", httpx.AsyncClient(), requests=2, failovers=1),
    )
    metrics = CollectorMetrics(
        "r1", "c-7", stats, in_flight=lambda: 3, served_version=lambda: 4, policy_lag=lambda: None, servers=lambda: pool
    )
    address = serve(metrics, served)
    assert value(scrape(address), "distrl_collector_steps_total", **IDENTITY) == 0

    for inference_s in (0.02, 0.2, 2.0):
        stats.step(inference_s, 0.001)
        metrics.step(inference_s, 0.001)
    stats.episode(Termination.SUCCESS, 2)
    metrics.episode(timedelta(seconds=0.7).total_seconds(), True)
    stats.episode(Termination.TRUNCATED, 1)
    metrics.episode(3.0, False)
    stats.published, stats.delivered = 2, 1
    samples = scrape(address)

    assert value(samples, "distrl_collector_steps_total", **IDENTITY) == 3
    assert value(samples, "distrl_collector_episodes_total", termination="success") == 1
    assert value(samples, "distrl_collector_episodes_total", termination="truncated") == 1
    assert value(samples, "distrl_collector_episodes_total", termination="env_error") == 0  # every one, from 0
    assert value(samples, "distrl_collector_successes_total") == 1
    assert value(samples, "distrl_collector_trajectories_published_total") == 2
    assert value(samples, "distrl_collector_trajectories_delivered_total") == 1
    assert value(samples, "distrl_collector_success_rate") == 0.5
    assert value(samples, "distrl_collector_episodes_in_flight") == 3
    assert value(samples, "distrl_collector_policy_version") == 4
    assert value(samples, "distrl_collector_server_requests_total", server="http://gpu-0:8000") == 5
    assert value(samples, "distrl_collector_server_requests_total", server="http://gpu-1:8000") == 2
    assert value(samples, "distrl_collector_server_failovers_total", server="http://gpu-1:8000") == 1
    assert value(samples, "distrl_collector_server_failovers_total", server="http://gpu-0:8000") == 0
    assert value(samples, "distrl_collector_server_policy_version", server="http://gpu-0:8000") == 4
    # Not read yet: no sample rather than a made-up version.
    assert value(samples, "distrl_collector_server_policy_version", server="http://gpu-1:8000") is None
    # Unknown (no pause_above_policy_lag): no sample rather than a made-up 0.
    assert value(samples, "distrl_collector_policy_lag_versions") is None
    assert value(samples, "distrl_collector_inference_latency_seconds_count") == 3
    assert value(samples, "distrl_collector_inference_latency_seconds_bucket", le="0.25") == 2
    assert value(samples, "distrl_collector_inference_latency_seconds_sum") == pytest.approx(2.22)
    assert value(samples, "distrl_collector_episode_duration_seconds_bucket", le="1.0") == 1
    assert value(samples, "distrl_collector_episode_duration_seconds_count") == 2
