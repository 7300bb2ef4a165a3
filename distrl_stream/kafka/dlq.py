"""The dead-letter queue: records a consumer cannot use go to ``{run}.dlq`` with where they were and why.

A dead letter's ``error_message`` is its reason, a line that starts with its category (:func:`reason`), so that
counting a DLQ by reason is counting prefixes: ``not Avro``, ``wrong magic byte``, ``unknown schema id``,
``truncated``, ``wrong event type``, ``impossible value``.

Each bad record lands in the DLQ once, keyed by where it was (``topic/partition/offset``), however often it is read:
a learner re-reads the records past its checkpoint after every restart, and every policy server and collector reads
the same ``{run}.weights``. The dead letters of one source partition are written by one transactional producer whose
``transactional.id`` names that partition; Kafka lets one producer per id write (a producer that takes the id over
fences the previous holder and aborts its open transaction), so the holder reads the letters of its partition already
on the DLQ when it takes the id, skips those, and commits the others (docs/design.md §3).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException, Message

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import DeliveryError, EventDecodeError, ImpossibleEventError, KafkaClientError
from distrl_stream.events import DeadLetter, event_key, from_epoch_ms, utc_now
from distrl_stream.kafka.client import error_text
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer

log = logging.getLogger(__name__)

# A commit that meets another holder of the id (or a broker blip) takes the id over and tries once more.
_COMMIT_ATTEMPTS = 2
# A writer whose commit failed (the cluster is unreachable) is tried again by later sends after this long, doubling:
# each try can block its caller (a learner's reader thread) for a few timeouts.
_RETRY_BACKOFF_S = 1.0
_RETRY_BACKOFF_MAX_S = 60.0
# A reader of the DLQ waits at an open transaction; a killed writer's is aborted after this long.
_TRANSACTION_TIMEOUT_MS = 10_000


class DeadLetterQueue:
    """Publishes :class:`~distrl_stream.events.DeadLetter` events for records a consumer had to skip, each once.

    A letter is committed as it is sent, or, inside :meth:`batch`, with the batch's others at its end (a learner
    dead-letters thousands of records of a poisoned topic in a few transactions, not one each)::

        with dead_letters.batch():
            for msg in records:
                handle(msg)  # may call dead_letters.send(msg, error)

    Args:
        kafka: the cluster.
        topic: the run's DLQ topic (``TopicNames(run).dlq``).
        consumer_name: who is dead-lettering (role and instance, or group id); recorded in every dead letter.
        timeout_s: how long a take-over, a read of the DLQ or a commit may take.
    """

    def __init__(self, kafka: KafkaConfig, topic: str, consumer_name: str, *, timeout_s: float = 30.0) -> None:
        self.kafka = kafka
        self.topic = topic
        self.consumer_name = consumer_name
        self.timeout_s = timeout_s
        self.count = 0  # dead letters this queue wrote
        self.duplicates = 0  # records skipped because their dead letter was already on the DLQ
        self._writers: dict[tuple[str, int], _PartitionWriter] = {}
        self._batch_depth = 0
        self._lock = threading.RLock()  # a learner sends from its reader thread and flushes from its trainer's
        # After a failed commit (the cluster unreachable: every writer fails alike), sends wait this long before
        # trying again, doubling: each try can block its caller (a learner's reader thread) for a few timeouts.
        self._retry_at = 0.0
        self._backoff_s = _RETRY_BACKOFF_S

    def send(self, msg: Message, error: BaseException) -> DeadLetter | None:
        """Dead-letter ``msg`` (raw key and value kept byte for byte) unless the DLQ already holds it.

        Returns:
            The dead letter written (or pending: a letter that could not be committed now, the cluster being
            unreachable, is committed by a later send or :meth:`flush`), or None when the record was already
            dead-lettered.
        """
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
        with self._lock:
            writer = self._writers.get((letter.topic, letter.partition))
            if writer is None:
                writer = self._writers[(letter.topic, letter.partition)] = _PartitionWriter(self, letter)
            if not writer.add(letter):
                self.duplicates += 1
                log.info("%s[%d]@%d is already on %s", letter.topic, letter.partition, letter.offset, self.topic)
                return None
            self.count += 1
            if self._batch_depth == 0:
                self._commit_now(writer)
                if event_key(letter) in writer.dropped:
                    return None
        log.warning(
            "dead-lettered %s[%d]@%d to %s: %s",
            letter.topic,
            letter.partition,
            letter.offset,
            self.topic,
            letter.error_message,
        )
        return letter

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Commit the letters sent inside the block together, at its end (also when it raises)."""
        with self._lock:
            self._batch_depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._batch_depth -= 1
                if self._batch_depth == 0:
                    for writer in self._writers.values():
                        if writer.pending:
                            self._commit_now(writer)

    def flush(self) -> None:
        """Commit every letter sent so far (before a consumer commits or checkpoints past their records).

        Raises:
            DeliveryError: some could not be committed; they are given up (``failed``), since the caller moves past
                their records, and their open transaction is aborted.
        """
        lost, errors = 0, []
        with self._lock:
            for writer in self._writers.values():
                if not writer.pending:
                    continue
                # While the cluster is known to be unreachable, trying would block the caller for nothing.
                if time.monotonic() < self._retry_at:
                    lost += writer.give_up()
                    errors.append(f"{writer.source}: the cluster was unreachable")
                    continue
                try:
                    writer.commit(_COMMIT_ATTEMPTS)
                except KafkaClientError as exc:
                    self._back_off()
                    lost += writer.give_up()
                    errors.append(str(exc))
        if lost:
            raise DeliveryError(f"{lost} dead letters lost: {'; '.join(errors)}", failed=lost, pending=0)

    @property
    def pending(self) -> int:
        """Dead letters sent but not committed yet."""
        with self._lock:
            return sum(len(writer.pending) for writer in self._writers.values())

    def close(self) -> None:
        """Commit what is pending and release the producers; logs (rather than raises) letters that were lost."""
        with self._lock:
            for writer in self._writers.values():
                try:
                    if time.monotonic() >= self._retry_at:
                        writer.commit(1)
                except KafkaClientError as exc:
                    log.error("%s: %d dead letters lost: %s", self.topic, len(writer.pending), exc)
                writer.close()
            self._writers.clear()

    def _commit_now(self, writer: _PartitionWriter) -> None:
        # A role reading records must ride out a broker outage: what fails is committed by a later send or flush,
        # and a failing writer is not tried again before its backoff ends (each try can block for a few timeouts).
        if time.monotonic() < self._retry_at:
            return
        try:
            writer.commit(_COMMIT_ATTEMPTS)
            self._retry_at, self._backoff_s = 0.0, _RETRY_BACKOFF_S
        except KafkaClientError as exc:
            self._back_off()
            log.warning("%d dead letters of %s not committed yet: %s", len(writer.pending), writer.source, exc)

    def _back_off(self) -> None:
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, _RETRY_BACKOFF_MAX_S)

    def _settle(self, taking_over: _PartitionWriter) -> None:
        """Commit the other writers' open transactions before ``taking_over`` reads the DLQ: the read waits for every
        open transaction, and this thread would otherwise wait for its own until the coordinator aborts it."""
        for writer in self._writers.values():
            if writer is not taking_over and writer.in_transaction and writer.failure is None:
                with contextlib.suppress(KafkaClientError):
                    writer.commit(1)


class _PartitionWriter:
    """The transactional producer of the dead letters of one source partition, and the keys already on the DLQ."""

    def __init__(self, queue: DeadLetterQueue, first: DeadLetter) -> None:
        self.queue = queue
        self.source = f"{first.topic}/{first.partition}/"
        self.transactional_id = f"{queue.topic}.{first.topic}.{first.partition}"
        self.pending: list[DeadLetter] = []  # sent in the open transaction, not committed yet
        self.dropped: set[bytes] = set()  # keys of letters sent here that a take-over found on the DLQ already
        self.known: set[bytes] = set()
        self.producer: Producer | None = None
        self.in_transaction = False
        # Why the id must be taken (over) before the next commit: not yet, or the producer was fenced or failed.
        # Taken at the first commit, so a batch's first letters wait for the read of what the DLQ holds.
        self.failure: BaseException | None = KafkaClientError("not taken over yet")

    def add(self, letter: DeadLetter) -> bool:
        """Queue ``letter`` in the open transaction; False if the DLQ already holds its record."""
        key = event_key(letter)
        if key in self.known:
            return False
        self.known.add(key)
        self.pending.append(letter)
        if self.failure is None:
            try:
                self._produce([letter])
            except (KafkaException, KafkaClientError) as exc:
                self.failure = exc  # the commit takes the id over and sends what the DLQ lacks
        return True

    def commit(self, attempts: int) -> None:
        """Commit the open transaction; when another holder fenced this one (or it failed), take the id back and
        resend what the DLQ lacks.

        Raises:
            KafkaClientError: still not committed after ``attempts`` tries; the letters stay pending.
        """
        for _ in range(attempts):
            if not self.pending:
                return
            try:
                if self.failure is not None:
                    log.info(
                        "dead letters of %s: %s; taking %s over",
                        self.source,
                        error_text(self.failure),
                        self.transactional_id,
                    )
                    self.queue._settle(self)
                    self._take_over()
                    # Another reader committed some meanwhile: they were duplicates, not letters of this queue.
                    there = {key for letter in self.pending if (key := event_key(letter)) in self.known}
                    self.queue.count -= len(there)
                    self.queue.duplicates += len(there)
                    self.dropped |= there
                    self.pending = [letter for letter in self.pending if event_key(letter) not in there]
                    self.known.update(event_key(letter) for letter in self.pending)
                    self._produce(self.pending)
                if not self.pending:
                    return
                assert self.producer is not None
                self.producer.client.commit_transaction(self.queue.timeout_s)
                self.pending.clear()
                self.in_transaction = False
                return
            except (KafkaException, KafkaClientError) as exc:
                self.failure = exc
        raise KafkaClientError(
            f"cannot commit {len(self.pending)} dead letters of {self.source} to {self.queue.topic}: "
            f"{error_text(self.failure)}"
        )

    def give_up(self) -> int:
        """Drop the pending letters (the next send takes the id over, which aborts their transaction); how many."""
        lost = len(self.pending)
        self.queue.count -= lost
        self.known.difference_update(event_key(letter) for letter in self.pending)
        self.pending = []
        self.failure = self.failure or KafkaClientError("pending dead letters given up")
        return lost

    def close(self) -> None:
        if self.producer is not None:
            # A fenced producer fails its flush; what it held is in `pending`, for the next holder to send.
            with contextlib.suppress(KafkaException, KafkaClientError):
                self.producer.close(self.queue.timeout_s)
            self.producer = None
        self.in_transaction = False

    def _take_over(self) -> None:
        """Take the transactional id (fencing any other holder) and read which records the DLQ already holds."""
        self.close()
        queue = self.queue
        self.producer = Producer(
            queue.kafka,
            client_id=f"{queue.consumer_name}-dlq",
            overrides=_transactional(queue.kafka, self.transactional_id),
        )
        try:
            self.producer.client.init_transactions(queue.timeout_s)
        except KafkaException as exc:
            raise KafkaClientError(f"cannot take {self.transactional_id} over: {error_text(exc)}") from None
        # After init_transactions every earlier holder of this id has committed or aborted; the read waits for other
        # partitions' writers' open transactions too (a letter of ours may be committed behind one of them).
        prefix = self.source.encode()
        # Long enough for a killed writer's open transaction to be aborted (its timeout, then the coordinator's check).
        read_s = max(queue.timeout_s, _transaction_timeout_ms(queue.kafka) / 1000 + 15.0)
        self.known = {
            key
            for m in read_topic(queue.kafka, queue.topic, timeout_s=read_s, through_open_transactions=True)
            if (key := m.key()) is not None and key.startswith(prefix)
        }
        self.failure = None

    def _produce(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        assert self.producer is not None
        if not self.in_transaction:
            self.producer.client.begin_transaction()
            self.in_transaction = True
        for letter in letters:
            self.producer.produce_event(self.queue.topic, letter)


def _transactional(kafka: KafkaConfig, transactional_id: str) -> dict[str, str | int]:
    """A DLQ writer's producer settings: its id, and a short transaction timeout, because a reader of the DLQ (a
    take-over, the monitor) waits at an open transaction, and the coordinator aborts a killed writer's open one only
    after this long."""
    return {"transactional.id": transactional_id, "transaction.timeout.ms": _transaction_timeout_ms(kafka)}


def _transaction_timeout_ms(kafka: KafkaConfig) -> int:
    # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
    return max(_TRANSACTION_TIMEOUT_MS, int(kafka.client_properties().get("message.timeout.ms", 0)))


def reason(error: BaseException, value: bytes | None) -> str:
    """Why ``value`` was dead-lettered, in one line that starts with its category.

    A value whose first byte is printable text is ``not Avro`` (JSON, a log line, a string); another non-zero first
    byte is a ``wrong magic byte`` (framing of some other serializer, or a corrupted record).
    """
    if isinstance(error, ImpossibleEventError):
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
