"""Feeding the monitor from Kafka: ``{run}.metrics`` (recent history, then live), the learner group's lag, the DLQ.

The monitor never joins a consumer group: history is read with :func:`~distrl_stream.kafka.consumer.read_topic`
(from ``now - history``, up to the watermarks at the start), and the live tail with an ``assign()``-only consumer
that starts where the history read ended, so no event is counted twice or missed. The learner group's lag comes from
its committed offsets (``list_consumer_group_offsets``, a read-only admin call) against the high watermarks.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from distrl_stream.config import Config
from distrl_stream.errors import EventDecodeError, KafkaClientError
from distrl_stream.events import MetricEvent, decode, utc_now
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import Consumer, read_topic
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
        self.undecodable = 0
        self._admin = Admin(cfg.kafka, timeout_s=timeout_s)
        self._consumer: Consumer | None = None
        self._resume: dict[int, int] = {}

    def backfill(self) -> int:
        """Read the last ``history_s`` of metrics; returns the number of events read.

        Raises:
            KafkaClientError: the run's metrics topic does not exist or the cluster did not answer.
        """
        try:
            return self._backfill()
        except KafkaException as exc:
            raise KafkaClientError(
                f"cannot read {self.topics.metrics} from {self.cfg.kafka.bootstrap_servers}: {exc.args[0].str()}"
            ) from None

    def _backfill(self) -> int:
        consumer = self._follower()
        partitions = self._partitions()
        # Watermarks before the history read: the live tail starts at or after them, never before.
        start = {p: consumer.client.get_watermark_offsets(TopicPartition(self.topics.metrics, p), self.timeout_s)[1]
                 for p in partitions}  # fmt: skip
        last: dict[int, int] = {}
        since = utc_now() - timedelta(seconds=self.history_s)
        count = 0
        for msg in read_topic(self.cfg.kafka, self.topics.metrics, since=since, timeout_s=max(self.timeout_s, 60.0)):
            last[msg.partition()] = msg.offset()
            count += self._add(msg.value())
        self._resume = {p: max(start[p], last.get(p, -1) + 1) for p in partitions}
        consumer.assign([TopicPartition(self.topics.metrics, p, o) for p, o in self._resume.items()])
        return count

    def poll(self, timeout_s: float = 0.5) -> int:
        """Take in the metric events that arrived since the last call; returns how many."""
        if not self._resume:
            self.backfill()
        count = 0
        for msg in self._follower().consume(500, timeout_s):
            count += self._add(msg.value())
        return count

    def refresh_kafka(self) -> None:
        """Update the learner group's consumer lag and the DLQ's record count (None where Kafka did not say)."""
        self.state.set_kafka(consumer_lag=self._consumer_lag(), dlq_records=self._dlq_records())

    def close(self) -> None:
        """Close the live consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _add(self, value: bytes | None) -> int:
        try:
            self.state.add(decode(value, MetricEvent))
        except EventDecodeError:
            self.undecodable += 1  # another role's consumer dead-letters bad records; a monitor only reads
            return 0
        return 1

    def _follower(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.cfg.kafka, client_id=f"distrl-monitor-{self.cfg.run}")
        return self._consumer

    def _partitions(self) -> list[int]:
        metadata = self._follower().client.list_topics(self.topics.metrics, timeout=self.timeout_s)
        info = metadata.topics.get(self.topics.metrics)
        if info is None or info.error is not None or not info.partitions:
            reason = info.error.str() if info is not None and info.error is not None else "no such topic"
            raise KafkaClientError(f"cannot read {self.topics.metrics}: {reason} (is run {self.cfg.run} started?)")
        return sorted(info.partitions)

    def _watermarks(self, topic: str) -> dict[int, tuple[int, int]] | None:
        client = self._follower().client
        try:
            info = client.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            if info is None or info.error is not None:
                return None
            return {p: client.get_watermark_offsets(TopicPartition(topic, p), self.timeout_s) for p in info.partitions}
        except KafkaException as exc:
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
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(self.topics.trajectories, p) for p in marks])
        try:
            future = self._admin.client.list_consumer_group_offsets([request], request_timeout=self.timeout_s)[group]
            committed = {tp.partition: tp.offset for tp in future.result(timeout=self.timeout_s).topic_partitions}
        except KafkaException as exc:
            log.warning("offsets of group %s: %s", group, exc)
            return None
        if all(offset < 0 for offset in committed.values()):
            return None  # the group has committed nothing yet (or does not exist)
        # A partition without a commit still has everything from its low watermark ahead of the group.
        return sum(high - max(low, committed.get(p, -1)) for p, (low, high) in marks.items())
