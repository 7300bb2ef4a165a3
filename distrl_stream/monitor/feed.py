"""Feeding the monitor from Kafka: ``{run}.metrics`` (recent history, then live), the learner group's lag, the DLQ.

The monitor never joins a consumer group: history is read with :func:`~distrl_stream.kafka.consumer.read_topic`
(from ``now - history``, up to the watermarks at the start), and the live tail with an ``assign()``-only consumer
that starts where the history read ended, so no event is counted twice or missed. The learner group's lag comes from
its committed offsets (``list_consumer_group_offsets``, a read-only admin call) against the high watermarks.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from distrl_stream.config import Config
from distrl_stream.errors import EventDecodeError, KafkaClientError
from distrl_stream.events import MetricEvent, utc_now
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.registry import use_schemas
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.monitor.state import MonitorState

log = logging.getLogger(__name__)


class MetricFeed:
    """Reads a run's metrics and Kafka-side numbers into a :class:`MonitorState`.

    Args:
        cfg: run and Kafka settings.
        state: the state to feed.
        history_s: how far back :meth:`backfill` reads ``{run}.metrics``.
        timeout_s: bound on each Kafka request (and on the history read).
    """

    def __init__(self, cfg: Config, state: MonitorState, *, history_s: float = 600.0, timeout_s: float = 30.0) -> None:
        self.cfg = cfg
        self.state = state
        self.topics = TopicNames(cfg.run)
        self.history_s = history_s
        self.timeout_s = timeout_s
        self._history_undecodable = 0
        self._admin = Admin(cfg.kafka, timeout_s=timeout_s)
        self._serde = use_schemas(cfg.kafka)  # the monitor creates no topics, so it registers nothing
        self._live: TopicFollower[MetricEvent] | None = None

    @property
    def undecodable(self) -> int:
        """Metric records that did not decode (another role's consumer dead-letters bad records; a monitor only
        reads)."""
        return self._history_undecodable + self._follower().undecodable

    def backfill(self) -> int:
        """Read the last ``history_s`` of metrics; returns the number of events read.

        Raises:
            KafkaClientError: the run's metrics topic does not exist or the cluster did not answer.
        """
        follower = self._follower()
        try:
            # Watermarks before the history read: the live tail starts at or after them, never before.
            start = follower.consumer.watermarks(self.topics.metrics, timeout_s=self.timeout_s)
        except KafkaClientError as exc:
            raise KafkaClientError(f"{exc} (is run {self.cfg.run} started?)") from None
        last: dict[int, int] = {}
        since = utc_now() - timedelta(seconds=self.history_s)
        count = 0
        for msg in read_topic(self.cfg.kafka, self.topics.metrics, since=since, timeout_s=max(self.timeout_s, 60.0)):
            last[msg.partition()] = msg.offset()
            count += self._add(msg.value())
        follower.start({p: max(high, last.get(p, -1) + 1) for p, (_low, high) in start.items()}, self.timeout_s)
        return count

    def poll(self, timeout_s: float = 0.5) -> int:
        """Take in the metric events that arrived since the last call; returns how many."""
        follower = self._follower()
        if not follower.partitions:
            self.backfill()
        events = follower.take(500, timeout_s)
        for event in events:
            self.state.add(event)
        return len(events)

    def refresh_kafka(self) -> None:
        """Update the learner group's consumer lag and the DLQ's record count (None where Kafka did not say)."""
        self.state.set_kafka(consumer_lag=self._consumer_lag(), dlq_records=self._dlq_records())

    def close(self) -> None:
        """Close the live consumer."""
        if self._live is not None:
            self._live.close()
            self._live = None

    def _add(self, value: bytes | None) -> int:
        try:
            self.state.add(self._serde.decode(value, MetricEvent))
        except EventDecodeError:
            self._history_undecodable += 1
            return 0
        return 1

    def _follower(self) -> TopicFollower[MetricEvent]:
        if self._live is None:
            self._live = TopicFollower(
                self.cfg.kafka, self.topics.metrics, MetricEvent, client_id=f"distrl-monitor-{self.cfg.run}"
            )
        return self._live

    def _watermarks(self, topic: str) -> dict[int, tuple[int, int]] | None:
        try:
            return self._follower().consumer.watermarks(topic, timeout_s=self.timeout_s)
        except KafkaClientError as exc:
            log.warning("watermarks of %s: %s", topic, exc)
            return None

    def _dlq_records(self) -> int | None:
        marks = self._watermarks(self.topics.dlq)
        return None if marks is None else sum(high - low for low, high in marks.values())

    def _consumer_lag(self) -> int | None:
        marks = self._watermarks(self.topics.trajectories)
        if marks is None:
            return None
        group = self.topics.learner_group
        try:
            committed = self._admin.committed_offsets(group, self.topics.trajectories, marks)
        except KafkaClientError as exc:
            log.warning("offsets of group %s: %s", group, exc)
            return None
        if all(offset < 0 for offset in committed.values()):
            return None  # the group has committed nothing yet (or does not exist)
        # A partition without a commit still has everything from its low watermark ahead of the group.
        return sum(high - max(low, committed.get(p, -1)) for p, (low, high) in marks.items())
