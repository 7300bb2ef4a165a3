"""The learner's newest published policy version, followed from ``{run}.weights`` (for ``pause_above_policy_lag``)."""

from __future__ import annotations

import logging

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from distrl_stream.config import Config
from distrl_stream.errors import KafkaClientError
from distrl_stream.events import WeightVersionEvent
from distrl_stream.kafka.consumer import Consumer, EventConsumer
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames

log = logging.getLogger(__name__)


class PublishedVersions:
    """Reads ``{run}.weights`` from the start, without a group (every collector must see every version), and keeps
    the newest version of one policy. :meth:`poll` never blocks, so it runs on the collector's event loop.

    Args:
        cfg: run, Kafka and policy id.
        dead_letters: producer for records that do not decode (they go to ``{run}.dlq``).
        client_id: names the consumer in broker logs.
    """

    def __init__(self, cfg: Config, dead_letters: Producer, client_id: str) -> None:
        self.topic = TopicNames(cfg.run).weights
        self.policy_id = cfg.model.policy_id
        self.latest = 0
        self._consumer = Consumer(cfg.kafka, client_id=client_id)
        self._events: EventConsumer[WeightVersionEvent] = EventConsumer(
            self._consumer,
            DeadLetterQueue(dead_letters, TopicNames(cfg.run).dlq, client_id),
            expect=WeightVersionEvent,
        )

    def start(self, timeout_s: float = 30.0) -> None:
        """Assign every partition of the topic from its beginning (blocking metadata call: run it off the loop).

        Raises:
            KafkaClientError: the topic cannot be read.
        """
        metadata = self._consumer.client.list_topics(self.topic, timeout=timeout_s)
        info = metadata.topics.get(self.topic)
        if info is None or info.error is not None or not info.partitions:
            reason = info.error.str() if info is not None and info.error is not None else "no such topic"
            raise KafkaClientError(f"cannot read {self.topic}: {reason}")
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(info.partitions)])

    def poll(self) -> int:
        """Take in every version event already fetched (no waiting) and return the newest version seen."""
        while (received := self._events.poll(0.0)) is not None:
            event = received.event
            if event.policy_id == self.policy_id and event.version > self.latest:
                log.info("learner published %s version %d", self.policy_id, event.version)
                self.latest = event.version
        return self.latest

    def close(self) -> None:
        """Release the consumer."""
        self._consumer.close()
