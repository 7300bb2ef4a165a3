"""Read a run's recorded trajectories back from Kafka, by time range or by offsets, without touching any group.

Everything here is built on :func:`distrl_stream.kafka.consumer.read_topic` (``assign`` + ``offsets_for_times``,
bounded by the high watermarks taken when the read starts), so a replay never joins or commits for the learner's
group and always ends, even while collectors keep writing. Replays are read-only: a record that does not decode is
counted (:class:`ReadCounts`) and skipped, not dead-lettered (the consumer that first met it already did that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import ConfigError, EventDecodeError
from distrl_stream.events import TrajectoryEvent, WeightVersionEvent, from_epoch_ms
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.registry import use_schemas
from distrl_stream.kafka.topics import TopicNames

# (records read so far, records expected in all or None when a time range makes the total unknown up front)
ProgressCallback = Callable[[int, int | None], None]


@dataclass(frozen=True, slots=True)
class ReplaySelection:
    """Which records of ``{run}.trajectories`` a replay reads.

    Attributes:
        since: first record time (inclusive, Kafka record timestamp = the collector's publish time).
        until: last record time (exclusive).
        partitions: only these partitions (None: all).
        start_offset: first offset read in each partition (inclusive).
        end_offset: offset where each partition's read stops (exclusive).
    """

    since: datetime | None = None
    until: datetime | None = None
    partitions: frozenset[int] | None = None
    start_offset: int | None = None
    end_offset: int | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError("--until", f"must be after --since ({self.since.isoformat()})")
        if self.start_offset is not None and self.end_offset is not None and self.start_offset >= self.end_offset:
            raise ConfigError("--end-offset", f"must be greater than --start-offset ({self.start_offset})")

    def accepts(self, partition: int, offset: int) -> bool:
        """Whether a record at ``partition``/``offset`` is in the selection (the time range is applied by the read)."""
        if self.partitions is not None and partition not in self.partitions:
            return False
        if self.start_offset is not None and offset < self.start_offset:
            return False
        return self.end_offset is None or offset < self.end_offset

    def describe(self) -> str:
        """The selection in words, for summaries."""
        parts = []
        if self.since is not None or self.until is not None:
            since = self.since.isoformat(timespec="seconds") if self.since else "the start"
            until = self.until.isoformat(timespec="seconds") if self.until else "the end"
            parts.append(f"from {since} to {until}")
        if self.partitions is not None:
            parts.append("partitions " + ",".join(str(p) for p in sorted(self.partitions)))
        if self.start_offset is not None or self.end_offset is not None:
            parts.append(f"offsets [{self.start_offset or 0}, {'end' if self.end_offset is None else self.end_offset})")
        return "; ".join(parts) or "everything"


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    """A decoded trajectory and where it was in the topic."""

    event: TrajectoryEvent
    partition: int
    offset: int
    timestamp: datetime


@dataclass(slots=True)
class ReadCounts:
    """What a replay met: records read from the topic, trajectories selected, records that did not decode."""

    read: int = 0
    selected: int = 0
    undecodable: int = 0
    first_error: str | None = None


@dataclass(frozen=True, slots=True)
class EpisodeSummary:
    """The per-episode facts statistics and plots need (a trajectory without its observations and tensors)."""

    episode_id: str
    collector_id: str
    env_kind: str
    task_id: str
    task_template: str
    split: str
    mode: str
    started_at: datetime
    ended_at: datetime
    termination: str
    success: bool
    total_reward: float
    length: int
    invalid_steps: int
    policy_versions: tuple[int, ...]
    inference_latency_s: tuple[float, ...]
    env_latency_s: tuple[float, ...]
    partition: int
    offset: int

    @classmethod
    def from_record(cls, record: TrajectoryRecord) -> EpisodeSummary:
        """Summarise one replayed trajectory."""
        e = record.event
        return cls(
            episode_id=e.episode_id,
            collector_id=e.collector_id,
            env_kind=e.env_kind,
            task_id=e.task_id,
            task_template=e.task_template,
            split=e.split,
            mode=e.mode,
            started_at=e.started_at,
            ended_at=e.ended_at,
            termination=str(e.termination),
            success=e.success,
            total_reward=e.total_reward,
            length=len(e.steps),
            invalid_steps=sum(not s.valid for s in e.steps),
            policy_versions=tuple(s.policy_version for s in e.steps),
            inference_latency_s=tuple(s.inference_latency_s for s in e.steps),
            env_latency_s=tuple(s.env_latency_s for s in e.steps),
            partition=record.partition,
            offset=record.offset,
        )

    @property
    def duration_s(self) -> float:
        """Wall time of the episode."""
        return (self.ended_at - self.started_at).total_seconds()


def read_trajectories(
    kafka: KafkaConfig,
    run: str,
    selection: ReplaySelection | None = None,
    *,
    counts: ReadCounts | None = None,
    progress: ProgressCallback | None = None,
    timeout_s: float = 600.0,
) -> Iterator[TrajectoryRecord]:
    """Yield the selected trajectories of ``run`` in partition order within each partition's offsets.

    Args:
        kafka: cluster address and client properties.
        run: the run whose ``{run}.trajectories`` is read.
        selection: time range, partitions and offsets (default: everything up to the watermarks at the start).
        counts: filled in while reading (records read, selected, undecodable).
        progress: called after each record read with (read so far, expected total or None).
        timeout_s: bound on the whole read.

    Raises:
        KafkaClientError: the topic does not exist, or the read did not finish within ``timeout_s``.
    """
    selection = selection or ReplaySelection()
    counts = counts if counts is not None else ReadCounts()
    topic = TopicNames(run).trajectories
    serde = use_schemas(kafka)
    total = _expected_records(kafka, topic, selection) if progress is not None else None
    for msg in read_topic(kafka, topic, since=selection.since, until=selection.until, timeout_s=timeout_s):
        counts.read += 1
        if progress is not None:
            progress(counts.read, total)
        partition, offset = msg.partition(), msg.offset()
        if not selection.accepts(partition, offset):
            continue
        try:
            event = serde.decode(msg.value(), TrajectoryEvent)
        except EventDecodeError as exc:
            counts.undecodable += 1
            counts.first_error = counts.first_error or f"{topic}[{partition}]@{offset}: {exc}"
            continue
        counts.selected += 1
        yield TrajectoryRecord(event, partition, offset, from_epoch_ms(msg.timestamp()[1]))


def read_weight_versions(kafka: KafkaConfig, run: str, *, timeout_s: float = 60.0) -> list[WeightVersionEvent]:
    """Every weight version still in ``{run}.weights``, oldest first (compaction may have dropped old ones).

    Raises:
        KafkaClientError: the topic does not exist or the cluster did not answer.
    """
    versions = []
    serde = use_schemas(kafka)
    for msg in read_topic(kafka, TopicNames(run).weights, timeout_s=timeout_s):
        try:
            versions.append(serde.decode(msg.value(), WeightVersionEvent))
        except EventDecodeError:
            continue  # already dead-lettered by the watcher that met it; a replay only reads
    return sorted(versions, key=lambda v: (v.created_at, v.version))


def _expected_records(kafka: KafkaConfig, topic: str, selection: ReplaySelection) -> int | None:
    """How many records the read will go through, when that is known before reading (no time range)."""
    if selection.since is not None:
        return None
    info = Admin(kafka).describe_topic(topic)
    return sum(p.high - p.low for p in info.partitions)
