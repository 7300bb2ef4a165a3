"""Synthetic events: deterministic per seed and of the size the benchmarks assume."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime

from distrl_stream.events import TrajectoryEvent, encode
from distrl_stream.testing.samples import sample_trajectory

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)


def _content(seed: int) -> TrajectoryEvent:
    """The trajectory of ``seed`` with fixed timestamps (they are taken from the clock)."""
    event = sample_trajectory(random.Random(seed))
    return replace(event, started_at=EPOCH, ended_at=EPOCH + (event.ended_at - event.started_at))


def test_same_seed_gives_the_same_trajectory() -> None:
    assert _content(7) == _content(7)
    assert _content(7) != _content(8)


def test_default_trajectory_is_twenty_steps_of_about_twenty_kilobytes_ending_done() -> None:
    event = sample_trajectory(random.Random(0))
    assert len(event.steps) == 20
    assert [s.done for s in event.steps] == [False] * 19 + [True]
    assert 15_000 < len(encode(event)) < 25_000
