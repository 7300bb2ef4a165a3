"""Helpers for the analysis tests: replayed trajectories built from the event samples, with chosen times."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

from distrl_stream.analysis.replay import TrajectoryRecord
from distrl_stream.events import Termination, WeightVersionEvent
from distrl_stream.testing.samples import sample_trajectory, sample_weight_version

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def make_record(
    rng: random.Random,
    *,
    offset: int,
    ended_min: float,
    versions: list[int],
    success: bool = False,
    template: str = "open_setting",
    collector: str = "collector-0",
    partition: int = 0,
) -> TrajectoryRecord:
    """A trajectory ending ``ended_min`` minutes after T0 whose steps acted with ``versions``."""
    event = sample_trajectory(rng, steps=len(versions), observation_chars=40, candidates=2, action_tokens=3)
    steps = [dataclasses.replace(s, policy_version=v) for s, v in zip(event.steps, versions, strict=True)]
    ended = T0 + timedelta(minutes=ended_min)
    event = dataclasses.replace(
        event,
        steps=steps,
        success=success,
        termination=Termination.SUCCESS if success else Termination.FAILURE,
        task_template=template,
        collector_id=collector,
        started_at=ended - timedelta(seconds=10),
        ended_at=ended,
    )
    return TrajectoryRecord(event, partition, offset, ended)


def make_weights(rng: random.Random, published_min: dict[int, float]) -> list[WeightVersionEvent]:
    """Weight versions published ``published_min[version]`` minutes after T0."""
    return [
        dataclasses.replace(sample_weight_version(rng, version=v), created_at=T0 + timedelta(minutes=m))
        for v, m in published_min.items()
    ]
