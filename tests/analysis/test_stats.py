"""Replay statistics: version lag, success by task, distributions."""

from __future__ import annotations

import random

import pytest

from distrl_stream.analysis.replay import EpisodeSummary, ReplaySelection, TrajectoryRecord
from distrl_stream.analysis.stats import Distribution, compute_stats, step_lags
from distrl_stream.errors import ConfigError
from tests.analysis.helpers import T0, make_record, make_weights


def _summaries(*records: TrajectoryRecord) -> list[EpisodeSummary]:
    return [EpisodeSummary.from_record(r) for r in records]


def test_lag_counts_versions_published_before_the_episode_ended() -> None:
    rng = random.Random(1)
    weights = make_weights(rng, {1: 1.0, 2: 2.0})
    early, late = _summaries(
        make_record(rng, offset=0, ended_min=1.5, versions=[0]),
        make_record(rng, offset=1, ended_min=3.0, versions=[0, 1, 2]),
    )
    assert step_lags([early, late], weights) == [[1], [2, 1, 0]]


def test_lag_without_weight_history_uses_the_versions_seen_acting() -> None:
    rng = random.Random(2)
    # The weights topic was compacted away: version 3 is known from the episode that used it first.
    first_v3 = make_record(rng, offset=0, ended_min=1.0, versions=[3])
    stale = make_record(rng, offset=1, ended_min=2.0, versions=[1, 2])
    before = make_record(rng, offset=2, ended_min=0.5, versions=[1])
    assert step_lags(_summaries(first_v3, stale, before)) == [[0], [2, 1], [0]]


def test_stats_count_success_by_task_and_lengths() -> None:
    rng = random.Random(3)
    records = [
        make_record(rng, offset=0, ended_min=0.0, versions=[0, 0], success=True, template="a"),
        make_record(rng, offset=1, ended_min=1.0, versions=[0, 0, 0, 0], template="a"),
        make_record(rng, offset=2, ended_min=2.0, versions=[1], success=True, template="b", collector="c1"),
    ]
    stats = compute_stats(_summaries(*records))
    assert (stats.episodes, stats.steps, stats.successes) == (3, 7, 2)
    assert stats.success_rate == pytest.approx(2 / 3)
    by_task = {t.task: t for t in stats.by_task}
    assert by_task["a"].success_rate == 0.5 and by_task["a"].mean_length == 3.0
    assert by_task["b"].success_rate == 1.0
    assert stats.by_collector == {"c1": 1, "collector-0": 2}
    assert stats.trajectories_per_min == pytest.approx(1.5)  # 3 episodes over 2 minutes
    assert stats.length.max == 4 and stats.length.p50 == 2
    # v1 first acted at minute 2, after the version-0 episodes had ended: nothing was stale.
    assert stats.lag_histogram == {0: 7}
    assert stats.to_dict()["by_task"][0]["success_rate"] == 0.5


def test_stats_of_nothing_are_zero() -> None:
    stats = compute_stats([])
    assert stats.episodes == 0 and stats.success_rate == 0.0 and stats.trajectories_per_min == 0.0
    assert Distribution.of([]) == Distribution()


def test_selection_by_partition_and_offsets() -> None:
    selection = ReplaySelection(partitions=frozenset({1}), start_offset=10, end_offset=20)
    assert selection.accepts(1, 10) and selection.accepts(1, 19)
    assert not selection.accepts(1, 20) and not selection.accepts(1, 9) and not selection.accepts(0, 15)
    assert "partitions 1" in selection.describe()


def test_selection_rejects_empty_ranges() -> None:
    with pytest.raises(ConfigError, match="--until"):
        ReplaySelection(since=T0, until=T0)
    with pytest.raises(ConfigError, match="--end-offset"):
        ReplaySelection(start_offset=5, end_offset=5)
