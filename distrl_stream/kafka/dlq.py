"""The dead-letter queue: records a consumer cannot use go to ``{run}.dlq`` with where they were and why.

A dead letter's ``error_message`` is its reason, a line that starts with its category (:func:`reason`), so that
counting a DLQ by reason is counting prefixes: ``not Avro``, ``wrong magic byte``, ``unknown schema id``,
``truncated``, ``wrong event type``, ``impossible value``.
"""

from __future__ import annotations

import logging

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from distrl_stream.errors import EventDecodeError, TrajectoryError
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
            error_message=reason(error, msg.value()),
            timestamp=utc_now(),
            consumer=self.consumer_name,
            original_timestamp=None if ts_type == TIMESTAMP_NOT_AVAILABLE else from_epoch_ms(ts_ms),
        )
        self.producer.produce_event(self.topic, letter)
        self.count += 1
        log.warning(
            "dead-lettered %s[%d]@%d to %s: %s",
            letter.topic,
            letter.partition,
            letter.offset,
            self.topic,
            letter.error_message,
        )
        return letter

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every dead letter sent so far is acknowledged (raises ``KafkaClientError`` if not)."""
        self.producer.flush(timeout_s)


def reason(error: BaseException, value: bytes | None) -> str:
    """Why ``value`` was dead-lettered, in one line that starts with its category.

    A value whose first byte is printable text is ``not Avro`` (JSON, a log line, a string); another non-zero first
    byte is a ``wrong magic byte`` (framing of some other serializer, or a corrupted record).
    """
    if isinstance(error, TrajectoryError):
        return f"impossible value: {error}"
    if not isinstance(error, EventDecodeError):
        return f"{type(error).__name__}: {error}"
    match error.reason:
        case "bad magic byte" if value and _is_text(value[:64]):
            return f"not Avro: text {value[:40]!r}"
        case "bad magic byte":
            return f"wrong magic byte {value[0]:#04x} (expected 0x00)" if value else f"not Avro: {error.detail}"
        case "unknown schema id":
            return f"unknown schema id {error.schema_id}: {error.detail}"
        case "truncated":
            return f"truncated: {error.detail}"
        case "unexpected type":
            return f"wrong event type: {error.detail}"
        case _:  # empty, too short, malformed, trailing bytes
            return f"not Avro: {error.reason}: {error.detail}"


def _is_text(head: bytes) -> bool:
    text = head.decode("utf-8", errors="ignore")  # a multi-byte character cut at the end is not binary
    return bool(text) and all(c.isprintable() or c in "\t\n\r" for c in text)
