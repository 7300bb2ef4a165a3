"""Where the trajectory reader continues when partitions come and go (rebalance callbacks; no services): a lone
member's partitions lost to a session time-out resume where it stopped, a group member's are fatal, and records
fetched before a rebalance of their partition are not used beside the same records read again after it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pytest
from confluent_kafka import TopicPartition

from distrl_stream.config import load_config
from distrl_stream.errors import LearnerError
from distrl_stream.learner.ingest import CHECKPOINT_MARK, Entry, EntryKind, TrajectoryReader

TOPIC = "run.trajectories"


class StandInConsumer:
    """The calls the rebalance callbacks make, with what the group last committed."""

    def __init__(self, committed: Mapping[int, tuple[int, str]] | None = None) -> None:
        self._committed = dict(committed or {})
        self.assigned: list[tuple[int, int]] = []
        self.waited: list[bool] = []  # per commit: whether it waited for the coordinator's answer

    def committed(self, _topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, str]]:
        return {p: self._committed[p] for p in partitions if p in self._committed}

    def watermarks(self, _topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        return {p: (0, 100) for p in partitions}

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = sorted((tp.partition, tp.offset) for tp in partitions)

    def commit_offsets(
        self, _topic: str, offsets: Mapping[int, int], metadata: Mapping[int, str], *, asynchronous: bool = False
    ) -> None:
        self._committed.update({p: (o, metadata[p]) for p, o in offsets.items()})
        self.waited.append(not asynchronous)


@dataclass(frozen=True)
class StandInRecord:
    at: tuple[int, int]  # partition, offset

    def partition(self) -> int:
        return self.at[0]

    def offset(self) -> int:
        return self.at[1]


class PollingStandIn(StandInConsumer):
    """poll() hands out a script: records, and rebalances that run inside a poll (as librdkafka runs callbacks)."""

    def __init__(self, script: list[tuple[int, int] | Callable[[], None]]) -> None:
        super().__init__()
        self.script = script

    def poll(self, _timeout_s: float) -> StandInRecord | None:
        while self.script:
            step = self.script.pop(0)
            if callable(step):
                step()
            else:
                return StandInRecord(step)
        return None


def _reader(solo: bool, start: Mapping[int, int]) -> TrajectoryReader:
    return TrajectoryReader(load_config(run="run"), "0", start, generation="g1", solo=solo)


def _read(reader: TrajectoryReader, partition: int, offset: int) -> Entry:
    """An entry as the reader thread makes it: stamped with its partition's current assignment."""
    return Entry(partition, offset, f"e{offset}", EntryKind.EPISODE, assignment=reader._assigned.get(partition, 0))


def _use(reader: TrajectoryReader, partition: int, offsets: Iterable[int]) -> None:
    for offset in offsets:
        assert reader.accept(_read(reader, partition, offset))


def _tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


def test_a_lone_member_continues_where_it_stopped_when_its_lost_partitions_come_back() -> None:
    reader = _reader(solo=True, start={0: 5, 1: 3})
    consumer = StandInConsumer(committed={0: (5, "g0"), 1: (3, "g0")})  # a checkpoint's commit, of an older start
    reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]
    assert consumer.assigned == [(0, 5), (1, 3)]
    _use(reader, 0, range(5, 9))
    _use(reader, 1, range(3, 4))

    reader._on_lost(consumer, _tps(0, 1))  # type: ignore[arg-type]
    assert not reader.accept(_read(reader, 0, 9))  # nothing of a lost partition is used
    reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]
    # Not the committed checkpoint offsets (5, 3): the episodes used since would be ingested twice.
    assert consumer.assigned == [(0, 9), (1, 4)]
    assert reader.positions() == {0: 9, 1: 4}


def test_a_lost_partition_another_member_got_is_forgotten() -> None:
    reader = _reader(solo=True, start={0: 5, 1: 3})
    consumer = StandInConsumer()
    reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]
    _use(reader, 1, range(3, 6))
    reader._on_lost(consumer, _tps(0, 1))  # type: ignore[arg-type]
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    assert consumer.assigned == [(0, 5)]
    assert reader.positions() == {0: 5}  # partition 1 is no longer this member's to checkpoint
    reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]
    assert consumer.assigned == [(0, 5), (1, 3)]  # back from the checkpoint, not from the forgotten position


def test_a_checkpoint_s_commit_is_not_waited_for_and_is_never_read_as_a_hand_over() -> None:
    reader = _reader(solo=False, start={0: 5})
    consumer = StandInConsumer()
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    _use(reader, 0, range(5, 9))
    reader.commit(reader.positions())
    reader._commit_pending(consumer)  # type: ignore[arg-type]
    assert consumer.committed(TOPIC, [0]) == {0: (9, "g1+checkpoint")} and consumer.waited == [False]
    reader._on_revoke(consumer, _tps(0))  # type: ignore[arg-type]
    assert consumer.committed(TOPIC, [0]) == {0: (9, "g1")} and consumer.waited == [False, True]  # the hand-over
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    assert consumer.assigned == [(0, 9)]

    # A retried checkpoint commit that reached the group after the hand-over: the next owner cannot know where the
    # last one stopped, and fails rather than guess.
    _use(reader, 0, range(9, 11))
    reader._on_revoke(consumer, _tps(0))  # type: ignore[arg-type]
    consumer.commit_offsets(TOPIC, {0: 9}, {0: "g1" + CHECKPOINT_MARK}, asynchronous=True)
    with pytest.raises(LearnerError, match=r"partition 0's last commit of this generation is a checkpoint's"):
        reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]


def test_a_group_member_that_lost_its_partitions_fails_for_a_restart_from_the_checkpoint() -> None:
    reader = _reader(solo=False, start={0: 5})
    consumer = StandInConsumer()
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    with pytest.raises(LearnerError, match=r"lost partitions \[0\].*restarts from its checkpoint"):
        reader._on_lost(consumer, _tps(0))  # type: ignore[arg-type]


def test_records_fetched_before_a_rebalance_of_their_partition_are_dropped_for_those_read_again_after_it() -> None:
    reader = _reader(solo=False, start={0: 0, 1: 5})
    consumer = PollingStandIn([])
    reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]

    def rebalance() -> None:  # eager: every partition is revoked, and the assignor gives both back to this member
        reader._on_revoke(consumer, _tps(0, 1))  # type: ignore[arg-type]
        reader._on_assign(consumer, _tps(0, 1))  # type: ignore[arg-type]

    consumer.script = [(0, 0), (1, 5), (0, 1), rebalance, (0, 0), (1, 5), (0, 1), (1, 6)]
    fetched = reader._fetch(consumer, 256, 0.0)  # type: ignore[arg-type]
    # Nothing was used, so both partitions are read again from their hand-overs: each record once, in order.
    assert consumer.committed(TOPIC, [0, 1]) == {0: (0, "g1"), 1: (5, "g1")} and consumer.assigned == [(0, 0), (1, 5)]
    assert [m.at for m in fetched] == [(0, 0), (1, 5), (0, 1), (1, 6)]


def test_entries_read_before_their_partition_was_revoked_are_refused_after_it_came_back() -> None:
    reader = _reader(solo=False, start={0: 0})
    consumer = StandInConsumer()
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    _use(reader, 0, [0])
    drained = [_read(reader, 0, offset) for offset in (1, 2)]  # the trainer holds them, not yet accepted
    reader._on_revoke(consumer, _tps(0))  # type: ignore[arg-type]
    reader._on_assign(consumer, _tps(0))  # type: ignore[arg-type]
    assert consumer.assigned == [(0, 1)]  # read again from the hand-over: the held entries would be used twice
    assert [reader.accept(e) for e in drained] == [False, False]
    _use(reader, 0, [1, 2])
    assert reader.positions() == {0: 3}
