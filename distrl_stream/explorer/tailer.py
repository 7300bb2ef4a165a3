"""Fills the explorer's index from Kafka the way replay reads (``assign`` + offsets, never a consumer group): newest
records first, then the live end, then the history backwards in chunks.

Opening a run therefore costs one chunk per partition, not a scan of the topic (issue 34: the first page of a topic of
100,000 episodes in under 2 s, ``bench/explorer.py``): the index starts with the last ``first_chunk`` records of each
partition of ``{run}.trajectories``, then alternates between the topic's end (new episodes appear as they are
published) and one older chunk per partition until it reaches the start. ``{run}.weights`` and ``{run}.dlq`` are small
and read from their start.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Mapping

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import EventDecodeError, KafkaClientError
from distrl_stream.events import DeadLetter, TrajectoryEvent, WeightVersionEvent, epoch_ms
from distrl_stream.explorer.index import PAGE_SIZE, Coverage, DeadLetterRow, EpisodeRow, Index, dead_letter_row
from distrl_stream.kafka import Message
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.registry import use_schemas
from distrl_stream.kafka.topics import TopicNames

log = logging.getLogger(__name__)

Ranges = dict[int, tuple[int, int]]


class Tailer:
    """The index's only writer: a thread that follows the run's topics.

    Args:
        kafka: cluster address and client properties.
        run: the run whose topics are read.
        index: the index it fills.
        first_chunk: records of each trajectories partition indexed first (the newest). A page's worth is enough:
            the newest page of the topic is among the newest page of each partition.
        backfill_chunk: records of each partition read per step backwards through the history.
        timeout_s: bound on each metadata request (a broker that does not answer fails :meth:`open` after it).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        run: str,
        index: Index,
        *,
        first_chunk: int = PAGE_SIZE,
        backfill_chunk: int = 500,
        timeout_s: float = 10.0,
    ) -> None:
        self.kafka = kafka
        self.topics = TopicNames(run)
        self.index = index
        self.first_chunk = first_chunk
        self.backfill_chunk = backfill_chunk
        self.timeout_s = timeout_s
        self.undecodable = 0
        self.error: str | None = None  # the last failure of the thread, shown on every page until it recovers
        self._serde = use_schemas(kafka)
        self._consumers = {
            topic: Consumer(kafka, client_id=f"distrl-explorer-{kind}")
            for kind, topic in (
                ("trajectories", self.topics.trajectories),
                ("weights", self.topics.weights),
                ("dlq", self.topics.dlq),
            )
        }
        self._backfill = Consumer(kafka, client_id="distrl-explorer-backfill")
        # Watermarks asked of a client that fetches nothing: a fetching consumer answered in up to 2 s (measured).
        self._probe = Consumer(kafka, client_id="distrl-explorer-watermarks")
        self._ranges: dict[str, Ranges] = {}
        self._marks: dict[int, tuple[int, int]] = {}
        self._opened_at: dict[int, int] = {}  # partition -> its end when open() ran, until read that far
        self._known: list[tuple[int, int]] = []  # (created ms, version), by time: when each version came to exist
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Check the run's topics, drop an index the topics no longer match, and read the weight versions.

        Raises:
            KafkaClientError: a topic of the run is missing or the cluster did not answer, as one line.
        """
        admin = Admin(self.kafka, timeout_s=self.timeout_s)
        existing = admin.topics()  # one line naming the cluster when it does not answer
        for topic in self._consumers:
            if topic not in existing:
                raise KafkaClientError(
                    f"run {self.topics.run}: no topic {topic} on {self.kafka.bootstrap_servers} "
                    "(see `distrl-stream topics list`)"
                )
        marks = {topic: c.watermarks(topic, timeout_s=self.timeout_s) for topic, c in self._consumers.items()}
        ids = admin.topic_ids(list(marks))
        if self.index.topic_ids() not in ({}, ids):
            log.info("explorer: the topics of %s were created again since it was indexed; rebuilding", self.topics.run)
            self.index.reset()
        self.index.set_topic_ids(ids)
        recorded = {topic: self.index.progress(topic) for topic in marks}
        for topic, partitions in marks.items():
            newest_only = topic == self.topics.trajectories
            ranges: Ranges = {}
            for p, (low, high) in partitions.items():
                if p in recorded[topic]:
                    lo, hi = recorded[topic][p]
                else:
                    lo = hi = max(low, high - self.first_chunk) if newest_only else low
                if lo < low:  # retention deleted the oldest records since the index was written
                    if newest_only:
                        self.index.forget_below(p, low)
                    lo, hi = low, max(hi, low)
                ranges[p] = (lo, hi)
            self._ranges[topic] = ranges
            self._consumers[topic].assign_offsets(topic, {p: hi for p, (_lo, hi) in ranges.items()})
        self._marks = marks[self.topics.trajectories]
        self._opened_at = {p: high for p, (_low, high) in self._marks.items()}
        self._known = sorted((v.created_ms, v.version) for v in self.index.versions())
        self._drain(self.topics.weights, marks[self.topics.weights])

    def start(self) -> None:
        """Follow the topics on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="explorer-tailer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and close the consumers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for consumer in (*self._consumers.values(), self._backfill, self._probe):
            consumer.close()

    def coverage(self) -> Coverage:
        """How much of ``{run}.trajectories`` is indexed (as of the watermarks last read)."""
        high = {p: h for p, (_low, h) in self._marks.items()}
        low = {p: lo for p, (lo, _h) in self._marks.items()}
        return self.index.coverage(self.topics.trajectories, high, low)

    def _run(self) -> None:
        marks_at = time.monotonic()  # open() just read them
        while not self._stop.is_set():
            try:
                if time.monotonic() - marks_at > 2.0:
                    self._marks = self._probe.watermarks(self.topics.trajectories, timeout_s=self.timeout_s)
                    marks_at = time.monotonic()
                self._forward(self.topics.weights, 0.0)
                self._forward(self.topics.dlq, 0.0)
                # The newest records first: no history is read before the end known at the start is indexed. Then a
                # chunk of history per turn, and once it is all in, waiting on the topic's end paces the loop.
                newest_in = self._newest_in()
                behind = newest_in and self._behind()
                self._forward(self.topics.trajectories, 0.0 if behind else 0.1 if not newest_in else 0.5)
                if behind:
                    self._backfill_step()
                self.error = None
            except KafkaClientError as exc:
                # The broker went away: say so on the pages and keep trying (it may come back).
                self.error = str(exc)
                log.warning("explorer: %s", exc)
                self._stop.wait(1.0)

    def _newest_in(self) -> bool:
        """Whether the trajectories up to the end seen at :meth:`open` are read (then the history may start)."""
        if self._opened_at:
            topic = self.topics.trajectories
            ranges = self._ranges[topic]
            positions = self._consumers[topic].positions(topic, self._opened_at)
            # A position past the end counts too: the last offsets may be markers of transactions, not records.
            self._opened_at = {
                p: high
                for p, high in self._opened_at.items()
                if high > ranges.get(p, (0, 0))[1] and high > positions.get(p, -1)
            }
        return not self._opened_at

    def _behind(self) -> bool:
        return any(
            lo > self._marks.get(p, (0, 0))[0] for p, (lo, _hi) in self._ranges[self.topics.trajectories].items()
        )

    def _forward(self, topic: str, timeout_s: float) -> None:
        """Index what arrived at the end of ``topic``."""
        messages = self._consumers[topic].consume(500, timeout_s)
        if messages:
            self._index(topic, messages, {})

    def _drain(self, topic: str, marks: Mapping[int, tuple[int, int]]) -> None:
        """Read ``topic`` forward up to the watermarks taken at :meth:`open`."""
        deadline = time.monotonic() + 60.0
        while any(self._ranges[topic][p][1] < high for p, (_low, high) in marks.items()):
            if time.monotonic() > deadline:
                raise KafkaClientError(f"read of {topic} did not reach its end in 60 s")
            messages = self._consumers[topic].consume(500, 0.5)
            self._index(topic, messages, {})
            positions = self._consumers[topic].positions(topic, marks)
            # Past transaction markers no record arrives, but the position still moves: take it as read.
            self._ranges[topic] = {
                p: (lo, max(hi, positions.get(p, hi))) for p, (lo, hi) in self._ranges[topic].items()
            }

    def _backfill_step(self) -> None:
        """Index one older chunk of each trajectories partition not yet read back to its start."""
        topic = self.topics.trajectories
        todo = {
            p: (max(self._marks[p][0], lo - self.backfill_chunk), lo)
            for p, (lo, _hi) in self._ranges[topic].items()
            if p in self._marks and lo > self._marks[p][0]
        }
        if not todo:
            return
        self._backfill.assign_offsets(topic, {p: start for p, (start, _stop) in todo.items()})
        messages: list[Message] = []
        open_ = dict(todo)
        deadline = time.monotonic() + 30.0
        while open_ and time.monotonic() < deadline and not self._stop.is_set():
            messages += [m for m in self._backfill.consume(500, 0.2) if m.offset() < todo[m.partition()][1]]
            positions = self._backfill.positions(topic, open_)
            open_ = {p: r for p, r in open_.items() if positions.get(p, -1) < r[1]}
        done = {p: r for p, r in todo.items() if p not in open_}
        self._index(topic, [m for m in messages if m.partition() in done], {p: start for p, (start, _) in done.items()})

    def _index(self, topic: str, messages: list[Message], new_lo: Mapping[int, int]) -> None:
        """Decode ``messages`` of ``topic`` into index rows and write them with the ranges they extend."""
        ranges = self._ranges[topic]
        episodes: list[EpisodeRow] = []
        versions: list[WeightVersionEvent] = []
        letters: list[DeadLetterRow] = []
        for msg in messages:
            p, offset, published = msg.partition(), msg.offset(), msg.timestamp()[1]
            lo, hi = ranges.get(p, (offset, offset))
            ranges[p] = (lo, max(hi, offset + 1))
            try:
                if topic == self.topics.trajectories:
                    event = self._serde.decode(msg.value(), TrajectoryEvent)
                    episodes.append(
                        EpisodeRow.of(event, p, offset, published, self._newest_at(epoch_ms(event.ended_at)))
                    )
                elif topic == self.topics.weights:
                    version = self._serde.decode(msg.value(), WeightVersionEvent)
                    versions.append(version)
                    bisect.insort(self._known, (epoch_ms(version.created_at), version.version))
                else:
                    letters.append(dead_letter_row(self._serde.decode(msg.value(), DeadLetter), p, offset, published))
            except EventDecodeError:
                self.undecodable += 1  # read-only: the consumer that met it first dead-lettered it
        for p, lo in new_lo.items():
            ranges[p] = (lo, ranges[p][1])
        self.index.write({(topic, p): r for p, r in ranges.items()}, episodes, versions, letters)

    def _newest_at(self, ms: int) -> int:
        """The newest version published at or before ``ms`` (0 before the first)."""
        i = bisect.bisect_right(self._known, (ms, float("inf")))
        return max((v for _t, v in self._known[:i]), default=0)


def read_record(kafka: KafkaConfig, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> Message | None:
    """The record at ``partition``/``offset`` of ``topic``, read outside any group (None: not on the topic).

    Raises:
        KafkaClientError: the cluster did not answer within ``timeout_s``.
    """
    with Consumer(kafka, client_id="distrl-explorer-record") as consumer:
        low, high = consumer.watermarks(topic, [partition], timeout_s)[partition]
        if not low <= offset < high:
            return None
        consumer.assign_offsets(topic, {partition: offset})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                return msg if msg.offset() == offset else None  # a transaction marker or compacted away
        raise KafkaClientError(f"{topic}[{partition}]@{offset} did not arrive within {timeout_s:.0f} s")
