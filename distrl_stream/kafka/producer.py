"""An idempotent, counted producer: the one way roles write to Kafka."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Message

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import DeliveryError, KafkaAuthenticationError, KafkaClientError, RecordRejectedError
from distrl_stream.events import Event, Serde, default_serde, event_key
from distrl_stream.kafka.client import DEAD_LETTER_OVERHEAD_BYTES, build_client, client_config, login_watch

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | str]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def producer_defaults(kafka: KafkaConfig) -> dict[str, Any]:
    """The settings this wrapper fixes, each for a reason (a user's ``kafka.client`` may still override them)."""
    return {
        # Idempotence is off by default in librdkafka (unlike the Java client): without it a retry can duplicate or
        # reorder a trajectory.
        "enable.idempotence": True,
        # Implied by idempotence; explicit because a trajectory acknowledged by one replica only can be lost.
        "acks": "all",
        "compression.type": kafka.compression,
        # One trajectory is one message; long episodes with big accessibility trees exceed librdkafka's 1 MB default.
        "message.max.bytes": kafka.max_message_bytes + DEAD_LETTER_OVERHEAD_BYTES,
    }


@dataclass
class DeliveryStats:
    """Counts of a producer's messages since it was made. ``pending`` = produced but not yet acknowledged or failed."""

    produced: int = 0
    delivered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few delivery errors

    @property
    def pending(self) -> int:
        return self.produced - self.delivered - self.failed


class Producer:
    """A thin wrapper over ``confluent_kafka.Producer`` with safe defaults and counted deliveries.

    The librdkafka client is created on first use. Use it as a context manager (or call :meth:`close`) so queued
    messages are flushed::

        with Producer(cfg.kafka, client_id="collector-0") as producer:
            producer.produce_event(topics.trajectories, event)   # key = episode id

    Args:
        kafka: cluster address and extra librdkafka properties (``kafka.client``).
        client_id: shows up in broker logs and metrics.
        overrides: librdkafka properties that win over everything else.
        serde: event serde (default: the process-wide one).
        buffer_timeout_s: how long :meth:`produce` waits for room when librdkafka's local queue is full.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        *,
        client_id: str = "distrl-producer",
        overrides: Mapping[str, Any] | None = None,
        serde: Serde | None = None,
        buffer_timeout_s: float = 30.0,
    ) -> None:
        self.config = client_config(
            kafka,
            {**producer_defaults(kafka), "client.id": client_id, "error_cb": self._on_error},
            overrides,
        )
        self._login = login_watch(self.config)
        self.stats = DeliveryStats()
        self._serde = serde
        self._buffer_timeout_s = buffer_timeout_s
        self._client: confluent_kafka.Producer | None = None
        self._fatal: KafkaError | None = None
        self._lock = threading.Lock()  # delivery callbacks may run on any thread that polls
        # What the last flush already reported: each flush raises only for failures after it.
        self._reported_failures = 0
        self._first_unreported: str | None = None

    @property
    def client(self) -> confluent_kafka.Producer:
        """The underlying confluent-kafka producer (created on first access)."""
        if self._client is None:
            self._client = build_client(confluent_kafka.Producer, self.config, "producer")
        return self._client

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one message; delivery is asynchronous (see :attr:`stats`, :meth:`flush`).

        When librdkafka's local queue is full this serves delivery reports and retries for up to
        ``buffer_timeout_s`` instead of failing at once.

        Raises:
            RecordRejectedError: librdkafka refused this record (e.g. larger than ``message.max.bytes``).
            KafkaAuthenticationError: the cluster refused the login or TLS handshake.
            KafkaClientError: the producer hit a fatal error, or the queue stayed full.
        """
        self._login.check()
        if self._fatal is not None:
            raise KafkaClientError(f"producer is in a fatal state: {self._fatal.str()}")
        callback = self._count if on_delivery is None else self._counting(on_delivery)
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": callback}
        if headers is not None:
            kwargs["headers"] = list(headers)
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        client = self.client
        deadline = time.monotonic() + self._buffer_timeout_s
        while True:
            try:
                client.produce(topic, **kwargs)
                break
            except KafkaException as exc:
                raise RecordRejectedError(f"cannot produce to {topic}: {exc.args[0].str()}") from None
            except BufferError:
                # The local queue is full: serve delivery reports to make room, then retry.
                if time.monotonic() > deadline:
                    raise KafkaClientError(
                        f"producer queue to {topic} stayed full for {self._buffer_timeout_s:.0f} s "
                        f"({self.stats.pending} messages pending): is the cluster reachable?"
                    ) from None
                client.poll(0.1)
        self.stats.produced += 1
        client.poll(0)

    def produce_event(
        self,
        topic: str,
        event: Event,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Encode ``event`` (Confluent wire format) and queue it, keyed by :func:`event_key` unless ``key`` is given."""
        serde = self._serde or default_serde()
        self.produce(
            topic,
            serde.encode(event),
            event_key(event) if key is None else key,
            headers=headers,
            timestamp_ms=timestamp_ms,
            on_delivery=on_delivery,
        )

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return self.client.poll(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> DeliveryStats:
        """Wait until every queued message is acknowledged or failed; raise for the failures since the last flush.

        Each failure is reported by one flush only, so a message lost in a broker outage longer than
        ``message.timeout.ms`` fails that flush and not every later one; :attr:`stats` keeps the cumulative counts.

        Raises:
            KafkaAuthenticationError: the cluster refused the login or TLS handshake.
            DeliveryError: some deliveries failed since the previous flush (those messages are lost), or messages
                are still pending after ``timeout_s`` (they stay queued).
        """
        if self._client is None:
            return self.stats
        left = self._login.flush(self._client, timeout_s)
        with self._lock:
            failed, self._reported_failures = self.stats.failed - self._reported_failures, self.stats.failed
            first, self._first_unreported = self._first_unreported, None
        problems = []
        if failed:
            problems.append(f"{failed} messages failed delivery since the last flush (first: {first})")
        if left:
            problems.append(f"{left} messages still undelivered after {timeout_s:.0f} s")
        if problems:
            raise DeliveryError("; ".join(problems), failed=failed, pending=left)
        return self.stats

    def close(self, timeout_s: float = 30.0) -> DeliveryStats:
        """Flush and release the client; logs (rather than raises) what could not be delivered."""
        if self._client is not None:
            try:
                left = self._login.flush(self._client, timeout_s)
            except KafkaAuthenticationError as exc:
                left = len(self._client)
                log.warning("producer %s closed with %d undelivered messages: %s", self.config["client.id"], left, exc)
                self._client = None
                return self.stats
            if left or self.stats.failed:
                log.warning(
                    "producer %s closed with %d undelivered and %d failed messages%s",
                    self.config["client.id"],
                    left,
                    self.stats.failed,
                    f" (first error: {self.stats.errors[0]})" if self.stats.errors else "",
                )
            self._client = None
        return self.stats

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _count(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self.stats.delivered += 1
            else:
                self.stats.failed += 1
                error = f"{msg.topic()}: {err.str()}"
                if self._first_unreported is None:
                    self._first_unreported = error
                if len(self.stats.errors) < 10:
                    self.stats.errors.append(error)

    def _counting(self, user_callback: DeliveryCallback) -> DeliveryCallback:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            self._count(err, msg)
            user_callback(err, msg)

        return on_delivery

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            log.error("fatal producer error: %s", err.str())
        else:
            # Transient (broker down, all brokers unreachable): librdkafka keeps retrying by itself.
            log.warning("producer error: %s", err.str())
