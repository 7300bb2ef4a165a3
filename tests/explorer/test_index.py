"""The explorer's SQLite index without services: filters, sorting, paging, lag, and when it starts over."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from distrl_stream.errors import ConfigError
from distrl_stream.events import Termination, TrajectoryEvent, epoch_ms, from_epoch_ms
from distrl_stream.explorer.index import EpisodeRow, Filters, Index
from distrl_stream.testing.samples import sample_trajectory, sample_weight_version

TOPIC = "r.trajectories"
IDENTITY = {"run": "r", "bootstrap_servers": "127.0.0.1:9092"}


def _event(rng: random.Random, i: int) -> TrajectoryEvent:
    event = sample_trajectory(rng, steps=1 + i % 4, observation_chars=20, candidates=2, action_tokens=2)
    steps = [dataclasses.replace(s, policy_version=i // 4) for s in event.steps]
    return dataclasses.replace(
        event,
        steps=steps,
        task_template=("open_setting", "toggle_wifi", "100%_done")[i % 3],
        collector_id=f"collector-{i % 2}",
        success=i % 5 == 0,
        termination=Termination.SUCCESS if i % 5 == 0 else Termination.TRUNCATED,
    )


@pytest.fixture
def index(tmp_path: Path) -> Index:
    """An index of 20 episodes at offsets 0..19 of partition 0, published one second apart, versions 0..4."""
    rng = random.Random(3)
    built = Index(tmp_path / "i.sqlite", IDENTITY)
    rows = [EpisodeRow.of(_event(rng, i), 0, i, 1_000_000 + 1000 * i, newest=4) for i in range(20)]
    built.write({(TOPIC, 0): (0, 20)}, rows)
    return built


def _ids(index: Index, **query: str) -> list[int]:
    rows, _total = index.episodes(Filters.parse(query))
    return [r.offset for r in rows]


def test_filters_narrow_the_table_to_matching_episodes(index: Index) -> None:
    assert _ids(index, template="toggle_wifi", order="asc") == [1, 4, 7, 10, 13, 16, 19]
    assert _ids(index, success="yes", order="asc") == [0, 5, 10, 15]
    assert _ids(index, termination="success", collector="collector-1", order="asc") == [5, 15]
    assert _ids(index, version="2", order="asc") == [8, 9, 10, 11]
    assert _ids(index, min_length="4", order="asc") == [3, 7, 11, 15, 19]
    # Lag = newest version when it ended (4) - its version: episodes of version 4 are on-policy.
    assert _ids(index, max_lag="0", order="asc") == [16, 17, 18, 19]
    assert _ids(index, min_lag="4", order="asc") == [0, 1, 2, 3]


def test_a_template_with_sql_wildcards_matches_only_itself(index: Index) -> None:
    assert _ids(index, template="100%_done", order="asc") == [2, 5, 8, 11, 14, 17]
    assert _ids(index, task="%") == []  # a literal percent sign, in no task id


def test_sorting_and_pages_cover_every_episode_once(index: Index) -> None:
    rows, total = index.episodes(Filters.parse({"sort": "length"}), page_size=8)
    assert total == 20 and [r.length for r in rows] == sorted((r.length for r in rows), reverse=True)
    pages = [index.episodes(Filters.parse({"sort": "length", "page": str(p)}), page_size=8)[0] for p in (1, 2, 3)]
    assert sorted(r.offset for page in pages for r in page) == list(range(20))


def test_newest_first_is_the_default_order(index: Index) -> None:
    assert _ids(index)[:3] == [19, 18, 17]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"success": "maybe"}, "success"),
        ({"termination": "exploded"}, "termination"),
        ({"sort": "episode_id; DROP TABLE episodes"}, "sort"),
        ({"order": "up"}, "order"),
        ({"version": "two"}, "version"),
        ({"min_lag": "-1"}, "min_lag"),
        ({"since": "yesterday"}, "since"),
    ],
)
def test_a_bad_filter_value_names_its_parameter(query: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Filters.parse(query)
    assert raised.value.field == field


def test_a_time_range_selects_by_publication(index: Index) -> None:
    since = from_epoch_ms(1_000_000 + 5000).isoformat()
    until = from_epoch_ms(1_000_000 + 8000).isoformat()
    assert _ids(index, since=since, until=until, order="asc") == [5, 6, 7]


def test_an_index_of_another_run_or_format_starts_empty(index: Index, tmp_path: Path) -> None:
    assert Index(tmp_path / "i.sqlite", IDENTITY).episodes(Filters())[1] == 20  # the same run: kept
    other = Index(tmp_path / "i.sqlite", {**IDENTITY, "run": "other"})
    assert other.episodes(Filters())[1] == 0 and other.progress(TOPIC) == {}


def test_lag_is_measured_against_the_newest_version_published_before_the_episode_ended(tmp_path: Path) -> None:
    rng = random.Random(1)
    built = Index(tmp_path / "v.sqlite", IDENTITY)
    event = _event(rng, 4)  # acted with version 1
    published = [
        dataclasses.replace(
            sample_weight_version(rng, version=v),
            created_at=event.ended_at - (3 - v) * (event.ended_at - event.started_at),
        )
        for v in (1, 2, 3)
    ]
    built.write({}, versions=published)
    newest = built.newest_version_at(epoch_ms(event.ended_at))
    assert newest == 3
    assert EpisodeRow.of(event, 0, 0, 0, newest).lag == 2
    assert [v.version for v in built.versions()] == [3, 2, 1]


def test_coverage_counts_indexed_records_against_the_watermarks(index: Index) -> None:
    index.write({(TOPIC, 1): (40, 50)})
    coverage = index.coverage(TOPIC, high={0: 20, 1: 50}, low={0: 0, 1: 0})
    assert (coverage.indexed, coverage.total, coverage.complete) == (30, 70, False)


def test_success_tables_count_every_episode_once(index: Index) -> None:
    by_version = index.success_by_version()
    assert sum(n for _t, _v, n, _s in by_version) == 20
    assert sum(s for _t, _v, _n, s in by_version) == 4  # offsets 0, 5, 10, 15 succeeded
    starts, over_time = index.success_over_time()
    assert sum(n for _t, _i, n, _s in over_time) == 20
    assert all(0 <= i < len(starts) for _t, i, _n, _s in over_time)
