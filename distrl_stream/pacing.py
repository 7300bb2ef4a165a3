"""Pacing: how fast collection runs against learning, as pure functions both roles call (docs/design.md §5.10).

Four rules pace a run, each read by one side from what the other publishes on Kafka, never from a protocol of its own:

- **the rate limit** (collectors, async mode, ``collector.samples_per_insert``): start an episode only while the
  records on ``{run}.trajectories`` stay within :func:`insert_budget` of the learner's newest version (Reverb's
  samples-per-insert; the topic's watermarks and the version's ``learner_step``);
- **the replay cap** (learner, async mode, ``learner.max_replay_ratio``): update only while the episodes sampled
  stay within the cap per record read (:func:`may_update`);
- **sync rounds** (``collector.mode = "sync"``, ``learner.round_episodes``): a round ends, and a version is
  published, once the round's every attempt has reached the learner (:func:`round_complete`);
- **the staleness pause** (``collector.pause_above_policy_lag``): wait while the server lags the learner's versions.

Each rule by itself is Reverb's or DigiRL's; what stalls is a combination, so :func:`check` refuses at config load
every combination under which both sides can end up waiting for each other:

- the rate limit under ``filtered_bc``: it makes no update while the buffer holds no success, so no version would
  ever lift a pause (the collectors then run unlimited; the learner has nothing else to spend the CPU on);
- a replay cap below the rate limit's ratio: the learner stops sampling before the collectors' budget grows;
- sync rounds with ``collector.on_error = "drop"``: a dropped attempt never reaches the learner, whose round then
  waits for it (``collector.sync_version_timeout_s`` per loss).

Both sides count the same thing, *records on the topic*, usable or not (dead letters, stale and incomplete
episodes too), over the whole run and the whole learner group: a lost episode then costs data, never progress. And
the rate limit starts with the first version cut after an update: before it the learner still fills its buffer,
whose ``min_buffer_episodes`` no loss may hold hostage. ``tests/test_pacing.py`` drives these functions over
generated configurations and event sequences and shows they always make progress (docs/design.md §5.10 says what
it does not model).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distrl_stream.config import CollectorConfig, LearnerConfig

# Algorithms whose update may find nothing to learn from in a full buffer (filtered BC without a success).
_MAY_NOT_UPDATE = frozenset({"filtered_bc"})


def insert_budget(
    learner_step: int,
    *,
    batch_episodes: int,
    samples_per_insert: float,
    min_buffer_episodes: int,
    updates_per_version: int,
) -> float:
    """The most records ``{run}.trajectories`` may hold when the learner's newest version was cut at
    ``learner_step`` updates: ``samples / samples_per_insert + slack`` (infinite until a version cut after an update
    is published).

    The slack is ``min_buffer_episodes`` (the learner samples nothing before it holds them) plus one version's worth
    of inserts (collectors hear of the learner's progress once per version).
    """
    if learner_step <= 0:
        return math.inf
    samples = learner_step * batch_episodes
    slack = min_buffer_episodes + updates_per_version * batch_episodes / samples_per_insert
    return samples / samples_per_insert + slack


def may_insert(on_topic: int, in_flight: int, budget: float) -> bool:
    """Whether one more episode fits ``budget``, counting the records on the topic and the episodes in flight."""
    return on_topic + in_flight + 1 <= budget


def may_update(updates: int, records_read: int, *, batch_episodes: int, max_replay_ratio: float) -> bool:
    """Whether the learner may make its next update after ``updates`` of them on ``records_read`` records
    (both since it started, the buffer it started with counted as read); ``max_replay_ratio`` 0: no cap."""
    if max_replay_ratio <= 0:
        return True
    return (updates + 1) * batch_episodes <= max_replay_ratio * max(records_read, 1)


def round_complete(records_since_version: int, round_episodes: int) -> bool:
    """Whether a sync round is over: every attempt of it (one record each, usable or not) has been read."""
    return records_since_version >= round_episodes


def rate_limited(collector: CollectorConfig, learner: LearnerConfig) -> bool:
    """Whether collectors apply the rate limit: it is set, collection is asynchronous and every update finds
    something to learn from."""
    return (
        collector.samples_per_insert is not None
        and collector.mode == "async"
        and learner.algorithm not in _MAY_NOT_UPDATE
    )


def check(collector: CollectorConfig, learner: LearnerConfig) -> None:
    """Refuse a combination of pacing settings under which collectors and learner can wait for each other for good.

    Raises:
        ValueError: one line naming the fields and why (the config loader turns it into a ConfigError).
    """
    spi = collector.samples_per_insert
    if spi is not None and collector.mode == "async":
        if learner.algorithm in _MAY_NOT_UPDATE:
            raise ValueError(
                f"collector.samples_per_insert ({spi}) cannot pace learner.algorithm = {learner.algorithm!r}: it "
                "makes no update while the buffer holds no success, so paused collectors would wait for a version "
                "forever; unset samples_per_insert"
            )
        if 0 < learner.max_replay_ratio < spi:
            raise ValueError(
                f"learner.max_replay_ratio ({learner.max_replay_ratio}) below collector.samples_per_insert ({spi}): "
                "the learner would stop sampling before the collectors' budget grows and both would wait; make the "
                "ratio at least samples_per_insert"
            )
    if collector.mode == "sync" and collector.on_error == "drop":
        raise ValueError(
            "collector.on_error = 'drop' with collector.mode = 'sync': a dropped episode never reaches the learner, "
            "whose round then waits collector.sync_version_timeout_s for it; use on_error = 'publish'"
        )
