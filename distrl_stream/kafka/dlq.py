"""The dead-letter queue: records a consumer cannot use go to ``{run}.dlq`` with where they were and why."""

from __future__ import annotations

import logging

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from distrl_stream.events import DeadLetter, from_epoch_ms, utc_now
from distrl_stream.kafka.producer import Producer

log = logging.getLogger(__name__)


class DeadLetterQueue:
    """Publishes :class:`~distrl_stream.events.DeadLetter` events for records a consumer had to skip.

    Args:
        producer: the producer to write with (its flush makes dead letters durable).
        topic: the run's DLQ topic (``TopicNames(run).dlq``).
        consumer_name: who is dead-lettering (role and instance, or group id); recorded in every dead letter.
    """

    def __init__(self, producer: Producer, topic: str, consumer_name: str) -> None:
        self.producer = producer
        self.topic = topic
        self.consumer_name = consumer_name
        self.count = 0

    def send(self, msg: Message, error: BaseException) -> DeadLetter:
        """Queue a dead letter for ``msg`` (raw key and value kept byte for byte); returns what was sent."""
        ts_type, ts_ms = msg.timestamp()
        letter = DeadLetter(
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=msg.key(),
            value=msg.value(),
            error_class=type(error).__name__,
            error_message=str(error),
            timestamp=utc_now(),
            consumer=self.consumer_name,
            original_timestamp=None if ts_type == TIMESTAMP_NOT_AVAILABLE else from_epoch_ms(ts_ms),
        )
        self.producer.produce_event(self.topic, letter)
        self.count += 1
        log.warning(
            "dead-lettered %s[%d]@%d to %s: %s", letter.topic, letter.partition, letter.offset, self.topic, error
        )
        return letter

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every dead letter sent so far is acknowledged (raises ``KafkaClientError`` if not)."""
        self.producer.flush(timeout_s)
