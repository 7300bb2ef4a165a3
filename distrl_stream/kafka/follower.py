"""Following one topic from its start (or from given offsets) without a group: every reader sees every record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Generic

from confluent_kafka import OFFSET_BEGINNING

from distrl_stream.config import KafkaConfig
from distrl_stream.kafka.consumer import Consumer, E, EventConsumer
from distrl_stream.kafka.dlq import DeadLetterQueue


class TopicFollower(Generic[E]):
    """Reads every partition of ``topic`` outside any consumer group and decodes its events.

    For readers that must each see the whole topic (every collector and every inference server reads all weight
    versions; a monitor reads all metrics): a group would split the partitions between them. :meth:`start` notes
    the high watermarks, so :meth:`caught_up` tells when the backlog that existed at start has been read::

        with TopicFollower(cfg.kafka, topics.weights, WeightVersionEvent, client_id="watcher") as follower:
            follower.start()
            while not follower.caught_up():
                backlog.extend(follower.take(timeout_s=0.5))

    Args:
        kafka: cluster address and extra librdkafka properties.
        topic: the topic to follow.
        expect: the event type on it; other records count as undecodable.
        client_id: names the consumer in broker logs.
        dead_letters: where undecodable records go; None only counts them (:attr:`undecodable`).
        check: the topic's validation of each decoded event (see :class:`EventConsumer`); what it rejects is handled
            as an undecodable record.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        expect: type[E],
        *,
        client_id: str,
        dead_letters: DeadLetterQueue | None = None,
        check: Callable[[E], None] | None = None,
    ) -> None:
        self.topic = topic
        self.consumer = Consumer(kafka, client_id=client_id)
        self.partitions: list[int] = []
        self.end_offsets: dict[int, int] = {}
        self._events: EventConsumer[E] = EventConsumer(self.consumer, dead_letters, expect=expect, check=check)

    @property
    def undecodable(self) -> int:
        """Records skipped (or dead-lettered) because they did not decode as the expected event type, or its check
        rejected them."""
        return self._events.undecodable

    def start(self, offsets: Mapping[int, int] | None = None, timeout_s: float = 30.0) -> None:
        """Assign every partition from its beginning, or from ``offsets[partition]`` where given (blocking metadata
        calls: run it off an event loop).

        Raises:
            KafkaClientError: the topic does not exist, or the cluster did not answer within ``timeout_s``.
        """
        marks = self.consumer.watermarks(self.topic, timeout_s=timeout_s)
        self.partitions = sorted(marks)
        self.end_offsets = {p: high for p, (_low, high) in marks.items()}
        given = {p: o for p, o in (offsets or {}).items() if p in marks}
        self.consumer.assign_offsets(self.topic, {p: given.get(p, OFFSET_BEGINNING) for p in self.partitions})

    def caught_up(self) -> bool:
        """True once every record that was on the topic when :meth:`start` ran has been read."""
        positions = self.consumer.positions(self.topic, self.partitions)
        return all(high == 0 or positions[p] >= high for p, high in self.end_offsets.items())

    def poll(self, timeout_s: float = 1.0) -> E | None:
        """The next event, or None when none arrived within ``timeout_s``."""
        received = self._events.poll(timeout_s)
        return None if received is None else received.event

    def take(self, max_events: int = 500, timeout_s: float = 0.0) -> list[E]:
        """Up to ``max_events`` events: waits up to ``timeout_s`` for the first, then takes only what is already
        fetched."""
        out: list[E] = []
        event = self.poll(timeout_s)
        while event is not None:
            out.append(event)
            if len(out) >= max_events:
                break
            event = self.poll(0.0)
        return out

    def close(self) -> None:
        """Release the consumer."""
        self.consumer.close()

    def __enter__(self) -> TopicFollower[E]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
