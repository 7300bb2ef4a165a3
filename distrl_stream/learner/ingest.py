"""Ingest: trajectories from ``{run}.trajectories`` into the learner, in a reader thread.

The reader is a member of the consumer group ``{run}.learner``. It polls, decodes (Avro) and converts each record
into an :class:`~distrl_stream.learner.records.EpisodeRecord` on its own thread and queues it for the trainer, which
drains the queue between updates without waiting. So a long update never keeps the consumer from polling (it polls
every 0.2 s whatever the trainer does: ``max.poll.interval.ms`` is never at risk), and decoding never stalls an
update. When the queue holds ``ingest_queue_episodes`` the reader pauses its partitions and keeps polling; it resumes
below half of that.

Offsets: the trainer *accepts* each queued record (:meth:`TrajectoryReader.accept`) before it uses it; the accepted
positions are what a checkpoint stores. Where reading starts when a partition is assigned (``on_assign``) follows
one rule (docs/learner.md, "Kafka offsets and checkpoint offsets"): every start of the learner (group) is a new
*generation* with its own token, and every commit carries that token as its metadata. A committed offset of the
current generation is where the previous owner handed the partition over in a rebalance (committed at its accepted
position on revocation): continue exactly there. Any other committed offset is older than the model in memory and
is ignored: read from the checkpoint's offset, and first re-read the range the checkpoint's replay shard held
(``rebuild`` entries: they refill the buffer and are never ingested again nor dead-lettered twice). Commits after a
checkpoint are not waited for (a member cut off from the cluster must keep polling to hear that its partitions were
lost), so a retry of one could reach the group after a later hand-over: their metadata is the token and
:data:`CHECKPOINT_MARK`, and a partition whose last commit of this generation is a checkpoint's fails the member (the
group restarts from its checkpoint) instead of being read as a hand-over.

Records that cannot be decoded, or decode into something that is not a usable episode for this learner
(:func:`.records.episode_from_event` raises :class:`~distrl_stream.errors.TrajectoryError`: malformed, acted by
another base model, choice-mode tokens that are not one of the step's candidates), go to ``{run}.dlq`` with the
reason; they still reach the trainer as dead entries so their offsets advance with the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config
from distrl_stream.errors import DeliveryError, EventDecodeError, KafkaClientError, LearnerError, TrajectoryError
from distrl_stream.events import Termination, TrajectoryEvent, default_serde
from distrl_stream.kafka import OFFSET_BEGINNING, Message, TopicPartition
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.dlq import DeadLetterQueue, reason
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.records import EpisodeRecord, episode_from_event

log = logging.getLogger(__name__)

# Appended to the generation token in the metadata of a checkpoint's commit (a hand-over's is the token alone).
CHECKPOINT_MARK = "+checkpoint"

# Episodes that ended without a verdict: the learner never trains on them (their last value is unknown).
INCOMPLETE_TERMINATIONS = frozenset({Termination.ENV_ERROR, Termination.INFERENCE_ERROR, Termination.ABANDONED})

# TrajectoryEvent -> EpisodeRecord, raising TrajectoryError for what the learner cannot use (the learner's own
# episode_from_event, with its base model and choice constraint).
Convert = Callable[[TrajectoryEvent], EpisodeRecord]


class EntryKind(StrEnum):
    """What a queued record turned out to be."""

    EPISODE = "episode"  # a usable episode (the trainer may still drop it as stale or incomplete)
    ATTEMPT = "attempt"  # an episode that failed before its first step (a sync round's record of it): counted only
    DEAD = "dead"  # undecodable or not an episode: sent to the DLQ


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of ``{run}.trajectories`` as the reader hands it to the trainer.

    Attributes:
        partition: its partition.
        offset: its offset.
        episode_id: the episode id (the record key for dead entries; "" when there was none).
        kind: episode, attempt or dead.
        episode: the converted episode (None for attempts and dead entries).
        termination: the episode's termination (None for dead entries).
        rebuild: re-read to refill the replay shard from a checkpoint (already ingested before it).
        reason: why a dead entry is unusable (its dead letter's reason; "" for episodes).
        versions: a dead entry that decoded: the versions that acted its steps (empty when undecodable).
        assignment: which assignment of its partition to this member it was read under (0: none yet):
            :meth:`TrajectoryReader.accept` refuses it once the partition was revoked, even if it came back since.
    """

    partition: int
    offset: int
    episode_id: str
    kind: EntryKind
    episode: EpisodeRecord | None = None
    termination: Termination | None = None
    rebuild: bool = False
    reason: str = ""
    versions: tuple[int, ...] = ()
    assignment: int = 0


def entry_from_message(
    msg: Message, dead_letters: DeadLetterQueue | None, convert: Convert = episode_from_event
) -> Entry:
    """Decode and convert one record; what cannot be used is dead-lettered (when ``dead_letters`` is given)."""
    key = msg.key()
    key_text = key.decode(errors="replace") if key else ""
    partition, offset = msg.partition() or 0, msg.offset() or 0
    event: TrajectoryEvent | None = None
    try:
        event = default_serde().decode(msg.value(), TrajectoryEvent)
        assert isinstance(event, TrajectoryEvent)  # decode(expect=...) guarantees it
        if not event.steps and event.termination in INCOMPLETE_TERMINATIONS:
            return Entry(partition, offset, event.episode_id, EntryKind.ATTEMPT, termination=event.termination)
        episode = convert(event)
    except (EventDecodeError, TrajectoryError) as exc:
        if dead_letters is not None:
            dead_letters.send(msg, exc)
        versions = tuple(sorted({s.policy_version for s in event.steps})) if event is not None else ()
        return Entry(partition, offset, key_text, EntryKind.DEAD, reason=reason(exc, msg.value()), versions=versions)
    return Entry(partition, offset, episode.episode_id, EntryKind.EPISODE, episode, event.termination)


class TrajectoryReader(BackgroundFollower):
    """The learner's consumer of ``{run}.trajectories`` in a background thread (see the module docstring).

    Args:
        cfg: run, Kafka and learner settings.
        member_id: this learner's id in the group (client id, DLQ consumer name, static membership).
        start_offsets: partition -> next offset to read, from the checkpoint; partitions not listed (and with no
            hand-over commit of this generation) start from the beginning.
        shard_from: partition -> first offset of the checkpoint's replay shard (re-read as ``rebuild`` entries).
        generation: this start's token, the metadata of every commit (see the module docstring).
        solo: whether this member is its group's only one: partitions it loses to a session time-out (cut off from
            the cluster for longer than ``session.timeout.ms``) can only come back to it, so it continues where it
            stopped; a member of a larger group cannot know who read them meanwhile and fails (its agent restarts the
            group from the checkpoint).
        convert: how a decoded event becomes an episode (default: :func:`.records.episode_from_event` unchecked).
    """

    def __init__(
        self,
        cfg: Config,
        member_id: str,
        start_offsets: Mapping[int, int] | None = None,
        *,
        shard_from: Mapping[int, int] | None = None,
        generation: str = "",
        convert: Convert = episode_from_event,
        solo: bool = False,
    ) -> None:
        super().__init__()
        self.thread_name = f"ingest-{member_id}"
        self.cfg = cfg
        self.member_id = member_id
        self.topics = TopicNames(cfg.run)
        self.dead_lettered = 0
        self.lag: int | None = None  # records on our partitions not yet accepted; None until measured
        self.ready = threading.Event()  # set once the first partitions are assigned
        self._start = dict(start_offsets or {})
        self._shard_from = dict(shard_from or {})
        self.generation = generation
        self._convert = convert
        self._solo = solo
        self._resume: dict[int, tuple[int, str]] = {}  # lost partitions: where this member continues (solo)
        self._positions: dict[int, int] = {}
        self._rebuild_until: dict[int, int] = {}  # partition -> end of its rebuild range (the checkpoint's offset)
        self._rebuild_pos: dict[int, int] = {}  # partition -> next rebuild offset not yet accepted
        # Partition -> the number of the assignment it is held under (entries read then carry it; see accept).
        self._assigned: dict[int, int] = {}
        self._queue: deque[Entry] = deque()
        self._cond = threading.Condition()
        self._pending_commit: dict[int, int] | None = None
        self._paused = False
        self._dead_letters: DeadLetterQueue | None = None
        self._rebalanced: set[int] = set()  # partitions a rebalance callback touched during the current poll
        self._assignments = 0  # assignments so far (numbers them)

    # -- trainer side ------------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 30.0) -> None:
        """Leave the group (committing nothing beyond what :meth:`commit` asked for) and wait for the thread."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        super().stop(timeout_s)

    def drain(self, max_entries: int | None = None) -> list[Entry]:
        """Take up to ``max_entries`` queued entries without waiting (oldest first)."""
        with self._cond:
            n = len(self._queue) if max_entries is None else min(max_entries, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued entries; True when some are there."""
        with self._cond:
            if not self._queue and not self._stop.is_set():
                self._cond.wait(timeout_s)
            return bool(self._queue)

    @property
    def queued(self) -> int:
        """Entries waiting for the trainer."""
        return len(self._queue)

    def accept(self, entry: Entry) -> bool:
        """Claim ``entry`` for the trainer: its partition's position moves past it.

        Returns:
            False when its partition was revoked since it was read (another member now owns it, or this one read
            it again from the hand-over; the trainer must not use it), else True.
        """
        with self._cond:
            if entry.assignment != self._assigned.get(entry.partition):
                return False
            if entry.rebuild:
                self._rebuild_pos[entry.partition] = entry.offset + 1
            else:
                self._positions[entry.partition] = entry.offset + 1
            return True

    def positions(self) -> dict[int, int]:
        """Partition -> next offset after the last accepted entry (what a checkpoint stores)."""
        with self._cond:
            return dict(self._positions)

    def rebuilt(self) -> set[int]:
        """The assigned partitions whose shard is whole again here: re-read and accepted up to the checkpoint's
        offset, or with nothing to re-read."""
        with self._cond:
            return {p for p in self._assigned if self._rebuild_pos.get(p, 0) >= self._rebuild_until.get(p, 0)}

    def flush_dead_letters(self) -> None:
        """Commit every dead letter sent so far (before a checkpoint moves past them).

        Raises:
            KafkaClientError: some could not be committed.
        """
        dead_letters = self._dead_letters
        if dead_letters is not None:
            dead_letters.flush()

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Ask the reader thread to commit these offsets (of a checkpoint) to the group."""
        with self._cond:
            self._pending_commit = dict(offsets)

    # -- reader thread -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            super()._run()  # a failure lands in `failed`; the learner stops on it
        finally:
            with self._cond:
                self._cond.notify_all()  # wake a trainer waiting for entries that will not come

    def _follow(self) -> None:
        ensure_run_topics(self.cfg)
        consumer = Consumer(
            self.cfg.kafka,
            group_id=self.topics.learner_group,
            client_id=f"learner-{self.member_id}",
            # Static membership: a member restarted by the elastic agent gets its partitions back without a rebalance.
            overrides={"group.instance.id": f"{self.topics.learner_group}-{self.member_id}"},
        )
        dead_letters = self._dead_letters = DeadLetterQueue(
            self.cfg.kafka, self.topics.dlq, f"{self.topics.learner_group}/{self.member_id}"
        )
        limit = self.cfg.learner.ingest_queue_episodes
        lag_due = 0.0
        try:
            consumer.subscribe(
                [self.topics.trajectories], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            while not self._stop.is_set():
                self._commit_pending(consumer)
                if time.monotonic() >= lag_due:
                    lag_due = time.monotonic() + self.cfg.learner.metrics_interval_s
                    self._measure_lag(consumer)
                self._flow_control(consumer, limit)
                batch = self._fetch(consumer, 256, 0.2)
                with dead_letters.batch():  # one transaction for a batch's dead letters
                    entries = [self._entry(msg, dead_letters) for msg in batch]
                self.dead_lettered = dead_letters.count
                if entries:
                    with self._cond:
                        owned = [e for e in entries if e.partition in self._assigned]
                        self._queue.extend(owned)
                        self._cond.notify_all()
            self._commit_pending(consumer)
        finally:
            consumer.close()
            dead_letters.close()
            self._dead_letters = None

    def _fetch(self, consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
        """Up to ``max_records`` records within ``timeout_s``, one poll at a time.

        A rebalance callback runs inside a poll. Records fetched before it of a partition it revoked or assigned are
        stale (whoever owns the partition now reads them again from the hand-over): they are dropped here, so every
        entry is read under the assignment it is stamped with. librdkafka purges them from a batch ``consume()`` too
        (its pull request 3269, for confluent-kafka-python issue 1013); one record a poll keeps this rule from
        depending on that."""
        fetched: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(fetched) < max_records:
            self._rebalanced.clear()
            msg = consumer.poll(max(deadline - time.monotonic(), 0.0))
            if self._rebalanced:
                fetched = [m for m in fetched if m.partition() not in self._rebalanced]
            if msg is None:
                break
            fetched.append(msg)
        return fetched

    def _measure_lag(self, consumer: Consumer) -> None:
        """``lag`` = Σ high watermark − accepted position over our partitions (queued entries count as lag)."""
        with self._cond:
            assigned = sorted(self._assigned)
            accepted = {p: self._positions[p] for p in assigned if p in self._positions}
        try:
            marks = consumer.watermarks(self.topics.trajectories, assigned, timeout_s=5.0)
            # A partition with nothing accepted yet: where the consumer is (negative before its first fetch).
            fetched = consumer.positions(self.topics.trajectories, [p for p in assigned if p not in accepted])
        except KafkaClientError as exc:
            log.debug("learner %s: lag not measured: %s", self.member_id, exc)
            return
        self.lag = sum(
            max(high - max(accepted.get(p, fetched.get(p, low)), low), 0) for p, (low, high) in marks.items()
        )

    def _entry(self, msg: Message, dead_letters: DeadLetterQueue) -> Entry:
        partition, offset = msg.partition() or 0, msg.offset() or 0
        with self._cond:
            rebuild = offset < self._rebuild_until.get(partition, -1)
            assignment = self._assigned.get(partition, 0)
        # Dead letters of the shard's range were sent before the checkpoint: do not send them twice.
        entry = entry_from_message(msg, None if rebuild else dead_letters, self._convert)
        return dataclasses.replace(entry, rebuild=rebuild, assignment=assignment)

    def _flow_control(self, consumer: Consumer, limit: int) -> None:
        queued = self.queued
        if not self._paused and queued >= limit:
            consumer.pause()
            self._paused = True
        elif self._paused and queued < max(limit // 2, 1):
            consumer.resume()
            self._paused = False

    def _commit_pending(self, consumer: Consumer) -> None:
        with self._cond:
            offsets, self._pending_commit = self._pending_commit, None
            owned = {p: o for p, o in (offsets or {}).items() if p in self._assigned}
        if owned:
            try:
                # Not waited for: checkpoint commits only show progress to lag tools (hand-over commits are the ones
                # that matter), and a wait while cut off would keep this thread from polling the loss of its partitions.
                metadata = dict.fromkeys(owned, self.generation + CHECKPOINT_MARK)
                consumer.commit_offsets(self.topics.trajectories, owned, metadata, asynchronous=True)
            except KafkaClientError as exc:
                log.warning("learner %s: %s", self.member_id, exc)

    def _let_go(self, partitions: set[int]) -> tuple[dict[int, int], dict[int, str]]:
        """Stop using ``partitions``: their queued entries are dropped (whoever continues reads them again); returns
        where that is (:meth:`_handover`). Under the lock."""
        for p in partitions:
            self._assigned.pop(p, None)
        kept = [e for e in self._queue if e.partition not in partitions]
        self._queue.clear()
        self._queue.extend(kept)
        return self._handover(partitions)

    def _forget(self, partition: int) -> None:
        """Drop where this member was in ``partition`` (another member owns it now); under the lock."""
        self._positions.pop(partition, None)
        self._rebuild_until.pop(partition, None)
        self._rebuild_pos.pop(partition, None)

    def _handover(self, partitions: set[int]) -> tuple[dict[int, int], dict[int, str]]:
        """Where the next owner of ``partitions`` continues (a rebuild in progress continues too); under the lock."""
        offsets, metadata = {}, {}
        for p in partitions:
            until = self._rebuild_until.get(p)
            if until is not None and self._rebuild_pos.get(p, until) < until:
                offsets[p], metadata[p] = self._rebuild_pos[p], f"{self.generation}/{until}"
            elif p in self._positions:
                offsets[p], metadata[p] = self._positions[p], self.generation
        return offsets, metadata

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = consumer.committed(self.topics.trajectories, [tp.partition for tp in partitions])
        shard = [tp.partition for tp in partitions if tp.partition in self._shard_from]
        # A shard's records that retention has deleted never come back: its re-read starts at the log's start.
        try:
            kept_from = {p: low for p, (low, _high) in consumer.watermarks(self.topics.trajectories, shard).items()}
        except KafkaClientError as exc:
            log.warning("learner %s: log starts of %s unknown (%s): re-read from the shard", self.member_id, shard, exc)
            kept_from = {}
        self._rebalanced.update(tp.partition for tp in partitions)
        with self._cond:
            # Partitions lost earlier that this assignment does not bring back belong to another member now.
            gone = set(self._resume) - {tp.partition for tp in partitions}
            for p in gone:
                del self._resume[p]
                self._forget(p)
            self._assignments += 1
            for tp in partitions:
                p = tp.partition
                self._assigned[p] = self._assignments
                offset, metadata = self._resume.pop(p, None) or committed.get(p, (-1, ""))
                token, _, until = metadata.partition("/")
                if self.generation and token == self.generation + CHECKPOINT_MARK:
                    raise LearnerError(
                        f"learner {self.member_id}: partition {p}'s last commit of this generation is a checkpoint's, "
                        "not the previous owner's hand-over (a retried checkpoint commit overtook it): the group "
                        "restarts from its checkpoint"
                    )
                if self.generation and token == self.generation:
                    # Handed over within this generation: continue exactly where the last owner stopped.
                    tp.offset = self._positions[p] = offset
                    if until:
                        self._rebuild_until[p] = self._positions[p] = int(until)
                        self._rebuild_pos[p] = offset
                elif p in self._start:
                    start = self._start[p]
                    first = min(max(self._shard_from.get(p, start), kept_from.get(p, 0)), start)
                    tp.offset = self._positions[p] = start
                    if first < start:
                        tp.offset = self._rebuild_pos[p] = first
                        self._rebuild_until[p] = start
                else:
                    tp.offset = OFFSET_BEGINNING
        # Assigning here with offsets set is how a rebalance callback chooses where reading starts.
        consumer.assign(partitions)
        self._paused = False
        log.info("learner %s assigned %s", self.member_id, [(tp.partition, tp.offset) for tp in partitions])
        self.ready.set()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self._solo:
            # Another member may have read them meanwhile: only a restart from the checkpoint is exact.
            raise LearnerError(
                f"learner {self.member_id} lost partitions {sorted(tp.partition for tp in partitions)} (its session "
                "timed out): the group restarts from its checkpoint"
            )
        lost = {tp.partition for tp in partitions}
        self._rebalanced |= lost
        with self._cond:
            # A hand-over to itself: queued entries not yet used are read again when the partitions come back.
            offsets, metadata = self._let_go(lost)
            self._resume.update({p: (offsets[p], metadata[p]) for p in offsets})
        log.warning(
            "learner %s lost partitions %s (session timed out, cut off from the cluster?); it continues where it "
            "stopped when they come back",
            self.member_id,
            sorted(lost),
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        self._rebalanced |= revoked
        with self._cond:
            offsets, metadata = self._let_go(revoked)
            for p in revoked:
                self._forget(p)
        if offsets:
            # A committed offset means "handled or dead-lettered": the letters below it first (best effort).
            dead_letters = self._dead_letters
            if dead_letters is not None:
                try:
                    dead_letters.flush()
                except DeliveryError as exc:
                    log.warning("learner %s: dead letters lost at the hand-over: %s", self.member_id, exc)
            # The next owner continues exactly after what this member used. A failed hand-over is fatal: the
            # group restarts from its checkpoint rather than let the next owner guess.
            consumer.commit_offsets(self.topics.trajectories, offsets, metadata)
        log.info("learner %s revoked %s", self.member_id, sorted(revoked))
