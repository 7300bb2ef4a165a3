"""Consumers: a group consumer that commits only what was processed, an event consumer that dead-letters what it
cannot decode, and :func:`read_topic` for replays that never join a group."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import EventDecodeError, ImpossibleEventError, KafkaClientError
from distrl_stream.events import Event, Serde, default_serde, epoch_ms
from distrl_stream.kafka.client import build_client, client_config, login_watch

if TYPE_CHECKING:  # the DLQ reads its own topic with read_topic, defined here
    from distrl_stream.kafka.dlq import DeadLetterQueue

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
# Called with this wrapper (not the raw client) and the partitions that moved.
RebalanceCallback = Callable[["Consumer", list[TopicPartition]], None]


def consumer_defaults(group_id: str, auto_offset_reset: str) -> dict[str, Any]:
    """The settings this wrapper fixes, each for a reason (a user's ``kafka.client`` may still override them)."""
    return {
        "group.id": group_id,
        # Auto-commit would acknowledge a trajectory before the learner has ingested it: a crash would lose it.
        "enable.auto.commit": False,
        # Offsets are stored only by processed(): a commit covers handled (or dead-lettered) records, never more.
        "enable.auto.offset.store": False,
        # A new group reads from the start: trajectories produced before the learner joined still count.
        "auto.offset.reset": auto_offset_reset,
        # Never see records of aborted transactions (librdkafka's default too; exactly-once ingest relies on it).
        "isolation.level": "read_committed",
    }


def _log_failed_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """librdkafka's ``on_commit``: the answer to an asynchronous commit, served inside a poll."""
    reasons = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in partitions if tp.error is not None]
    if err is not None and not reasons:
        reasons = [err.str()]
    if reasons:
        log.warning("an asynchronous commit failed: %s", "; ".join(reasons))


class Consumer:
    """A thin wrapper over ``confluent_kafka.Consumer``: manual commits of processed records, clean close.

    Process, mark, commit::

        with Consumer(cfg.kafka, group_id=topics.learner_group) as consumer:
            consumer.subscribe([topics.trajectories])
            while running:
                msg = consumer.poll(1.0)
                if msg is not None:
                    handle(msg)
                    consumer.processed(msg)
                consumer.commit()          # commits what processed() marked; cheap when nothing changed

    Args:
        kafka: cluster address and extra librdkafka properties (``kafka.client``).
        group_id: consumer group; None for a consumer that only uses :meth:`assign` and never commits.
        client_id: shows up in broker logs and in the group's member list.
        auto_offset_reset: where a group without committed offsets starts (``earliest`` or ``latest``).
        overrides: librdkafka properties that win over everything else.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        *,
        group_id: str | None = None,
        client_id: str = "distrl-consumer",
        auto_offset_reset: str = "earliest",
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        # librdkafka insists on a group id even for assign()-only use; such a group never joins nor commits.
        self.group_id = group_id
        group = group_id or f"distrl-nogroup-{uuid.uuid4().hex[:12]}"
        self.config = client_config(
            kafka,
            {**consumer_defaults(group, auto_offset_reset), "client.id": client_id, "on_commit": _log_failed_commit},
            overrides,
        )
        self._login = login_watch(self.config)
        self._client: confluent_kafka.Consumer | None = None
        self._stored = False

    @property
    def client(self) -> confluent_kafka.Consumer:
        """The underlying confluent-kafka consumer (created on first access), for seek/position/assignment."""
        if self._client is None:
            self._client = build_client(confluent_kafka.Consumer, self.config, "consumer")
        return self._client

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group on ``topics``; the callbacks run inside :meth:`poll` on rebalances.

        ``on_lost`` gets partitions taken away without a hand-over (the member's session timed out, e.g. cut off from
        the cluster): nothing can be committed for them any more. Without it they go to ``on_revoke``.
        """
        if self.group_id is None:
            raise KafkaClientError("subscribe() needs a group_id; use assign() for a consumer without a group")
        kwargs: dict[str, Any] = {}
        if on_assign is not None:
            kwargs["on_assign"] = lambda _client, partitions: on_assign(self, partitions)

        # Commit what was processed before the partitions move, so the next owner does not redo it.
        def revoke(_client: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
            self.commit()
            if on_revoke is not None:
                on_revoke(self, partitions)

        kwargs["on_revoke"] = revoke
        if on_lost is not None:
            kwargs["on_lost"] = lambda _client, partitions: on_lost(self, partitions)
        self.client.subscribe(list(topics), **kwargs)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read exactly these partitions (from their offsets, if set), outside any group rebalancing."""
        self.client.assign(list(partitions))

    def partitions(self, topic: str, timeout_s: float = 30.0) -> list[int]:
        """The partition ids of ``topic``, sorted.

        Raises:
            KafkaClientError: the topic does not exist, or the cluster did not answer within ``timeout_s``.
        """
        try:
            info = self.client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise KafkaClientError(f"cannot read {topic}: {exc.args[0].str()}") from None
        if info is None or info.error is not None or not info.partitions:
            reason = info.error.str() if info is not None and info.error is not None else "no such topic"
            raise KafkaClientError(f"cannot read {topic}: {reason}")
        return sorted(info.partitions)

    def watermarks(
        self, topic: str, partitions: Iterable[int] | None = None, timeout_s: float = 30.0
    ) -> dict[int, tuple[int, int]]:
        """Partition -> (low, high): the first offset still kept and the offset the next record will get.

        Args:
            topic: the topic.
            partitions: which partitions; every partition of the topic when None.
            timeout_s: bound on each request.

        Raises:
            KafkaClientError: the topic does not exist, or the cluster did not answer.
        """
        ids = self.partitions(topic, timeout_s) if partitions is None else list(partitions)
        try:
            return {p: self.client.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s) for p in ids}
        except KafkaException as exc:
            raise KafkaClientError(f"cannot read the watermarks of {topic}: {exc.args[0].str()}") from None

    def assign_from_start(
        self, topic: str, partitions: Iterable[int] | None = None, timeout_s: float = 30.0
    ) -> list[int]:
        """Read every partition of ``topic`` (or only ``partitions``) from its beginning, outside any group.

        Returns:
            The partitions assigned.

        Raises:
            KafkaClientError: ``partitions`` is None and the topic does not exist (or the cluster did not answer).
        """
        ids = self.partitions(topic, timeout_s) if partitions is None else sorted(partitions)
        self.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ids])
        return ids

    def assign_offsets(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Read each partition of ``topic`` in ``offsets`` from the offset given for it, outside any group."""
        self.assign([TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])

    def positions(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Partition -> offset of the next record :meth:`poll` returns (negative before the first one is read)."""
        return {tp.partition: tp.offset for tp in self.client.position([TopicPartition(topic, p) for p in partitions])}

    def pause(self) -> None:
        """Stop fetching every assigned partition (the group membership stays; :meth:`resume` undoes it)."""
        self.client.pause(self.client.assignment())

    def resume(self) -> None:
        """Fetch every assigned partition again after :meth:`pause`."""
        self.client.resume(self.client.assignment())

    def commit_offsets(
        self,
        topic: str,
        offsets: Mapping[int, int],
        metadata: Mapping[int, str] | None = None,
        *,
        asynchronous: bool = False,
    ) -> None:
        """Commit partition -> next offset to read for ``topic``, whatever :meth:`processed` marked.

        A synchronous commit waits for the group coordinator for as long as it takes: cut off from the cluster, that
        is until the link comes back, and a thread that polls nothing meanwhile never learns that its partitions were
        lost. ``asynchronous=True`` returns at once; a failure is logged when a later :meth:`poll` hears of it.

        Args:
            topic: the topic.
            offsets: partition -> next offset to read.
            metadata: partition -> the commit's metadata string (Kafka keeps it beside the offset).
            asynchronous: send the commit and return without waiting for the coordinator's answer.

        Raises:
            KafkaClientError: the group coordinator rejected the commit (or, asynchronous, it could not be sent).
        """
        meta = metadata or {}
        tps = [TopicPartition(topic, p, o, metadata=meta.get(p, "")) for p, o in sorted(offsets.items())]
        try:
            self.client.commit(offsets=tps, asynchronous=asynchronous)
        except KafkaException as exc:
            raise KafkaClientError(f"commit of {topic} {dict(offsets)} failed: {exc.args[0].str()}") from None

    def committed(self, topic: str, partitions: Iterable[int], timeout_s: float = 30.0) -> dict[int, tuple[int, str]]:
        """Partition -> (committed offset, its metadata) of this group; partitions without a commit are left out.

        Raises:
            KafkaClientError: the group coordinator did not answer.
        """
        try:
            tps = self.client.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaClientError(f"cannot read the committed offsets of {topic}: {exc.args[0].str()}") from None
        return {tp.partition: (tp.offset, tp.metadata or "") for tp in tps if tp.offset >= 0}

    def poll(self, timeout_s: float = 1.0) -> Message | None:
        """The next record, or None on timeout. Transient errors are logged and give None.

        Raises:
            KafkaAuthenticationError: the cluster refused the login or TLS handshake.
            KafkaClientError: a fatal client error (the consumer cannot go on).
        """
        msg = self.client.poll(timeout_s)
        self._login.check()  # poll() is where librdkafka reports a refused login
        if msg is None:
            return None
        err = msg.error()
        if err is None:
            return msg
        if err.fatal():
            raise KafkaClientError(f"fatal consumer error: {err.str()}")
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer %s: %s", self.config["client.id"], err.str())
        return None

    def consume(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` records in one call (cheaper per record than :meth:`poll` for batch ingest).

        Raises:
            KafkaAuthenticationError: the cluster refused the login or TLS handshake.
            KafkaClientError: a fatal client error.
        """
        out = []
        messages = self.client.consume(max_messages, timeout_s)
        self._login.check()
        for msg in messages:
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.fatal():
                raise KafkaClientError(f"fatal consumer error: {err.str()}")
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer %s: %s", self.config["client.id"], err.str())
        return out

    def processed(self, msg: Message) -> None:
        """Mark ``msg`` handled: the next :meth:`commit` covers it (and everything before it in its partition)."""
        self.client.store_offsets(message=msg)
        self._stored = True

    def commit(self) -> None:
        """Synchronously commit the offsets marked by :meth:`processed` (no-op when nothing new was marked).

        Raises:
            KafkaClientError: the group coordinator rejected the commit.
        """
        if not self._stored or self._client is None or self.group_id is None:
            return
        try:
            self._client.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise KafkaClientError(f"commit failed for group {self.group_id}: {exc.args[0].str()}") from None
        self._stored = False

    def close(self) -> None:
        """Commit what was processed, then leave the group (so its partitions move to others at once)."""
        if self._client is None:
            return
        try:
            self.commit()
        finally:
            self._client.close()
            self._client = None

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Received(Generic[E]):
    """A decoded event and the record it came from (topic, partition, offset, key, timestamp, headers)."""

    event: E
    message: Message


class EventConsumer(Generic[E]):
    """Decodes the records a :class:`Consumer` polls and checks each event; anything undecodable or impossible goes
    to the dead-letter queue and consumption goes on. A bad record therefore never stops a long-running role.

    Commit safety: a dead-lettered record is marked processed at once, and :meth:`commit` flushes the dead-letter
    producer before committing, so a committed offset always means the record is in the DLQ (or was handled).

    Args:
        consumer: the consumer to read (subscribed or assigned by the caller).
        dead_letters: where undecodable records go; None for a read-only observer, which only counts them
            (:attr:`undecodable`) and leaves dead-lettering to the role that owns the topic.
        expect: the event type this reader handles; other event types are dead-lettered as ``unexpected type``.
        serde: event serde (default: the process-wide one when decoding, which a role's start-up may have set).
        check: the topic's validation of a decoded event; an event it rejects (:class:`ImpossibleEventError`) is
            dead-lettered with its reason (``impossible value: …``) like an undecodable record.
    """

    def __init__(
        self,
        consumer: Consumer,
        dead_letters: DeadLetterQueue | None,
        *,
        expect: type[E] | None = None,
        serde: Serde | None = None,
        check: Callable[[E], None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.dead_letters = dead_letters
        self.undecodable = 0
        self._expect = expect
        self._serde = serde
        self._check = check

    def poll(self, timeout_s: float = 1.0) -> Received[E] | None:
        """The next decodable event, or None when none arrived within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            try:
                event: E = (self._serde or default_serde()).decode(msg.value(), self._expect)  # type: ignore[arg-type]
                if self._check is not None:
                    self._check(event)
                return Received(event, msg)
            except (EventDecodeError, ImpossibleEventError) as exc:
                # Then go on: past the deadline the next poll waits no more, but still returns a buffered record.
                self.undecodable += 1
                if self.dead_letters is not None:
                    self.dead_letters.send(msg, exc)
                    self.consumer.processed(msg)

    def processed(self, received: Received[E]) -> None:
        """Mark an event handled (see :meth:`Consumer.processed`)."""
        self.consumer.processed(received.message)

    def commit(self) -> None:
        """Make dead letters durable, then commit processed offsets."""
        if self.dead_letters is not None:
            self.dead_letters.flush()
        self.consumer.commit()


def read_topic(
    kafka: KafkaConfig,
    topic: str,
    *,
    since: datetime | int | None = None,
    until: datetime | int | None = None,
    timeout_s: float = 60.0,
    overrides: Mapping[str, Any] | None = None,
    through_open_transactions: bool = False,
) -> Iterator[Message]:
    """Read a topic's records in a time range without joining any group, for replays and late readers.

    Each partition is read from the first offset whose timestamp is at or after ``since`` (``offsets_for_times``;
    the beginning when None) up to the high watermark taken when the call starts, so the read always ends even while
    producers keep writing. Only records with ``since <= timestamp < until`` are yielded (producers can write
    timestamps out of offset order).

    Args:
        kafka: cluster address and extra librdkafka properties.
        topic: topic to read.
        since: start time (aware datetime, or epoch milliseconds).
        until: end time, exclusive (same forms).
        timeout_s: a bound on the whole read.
        through_open_transactions: end at the high watermark, waiting for the transactions open at the start to
            commit or abort, instead of at the last stable offset (where a ``read_committed`` reader's watermark is:
            before the first open transaction), so that every record committed up to the start is read.

    Raises:
        KafkaClientError: the cluster did not answer, the topic does not exist, or the read did not reach the
            watermarks within ``timeout_s``.
    """
    try:
        yield from _read_topic(
            kafka,
            topic,
            since=since,
            until=until,
            timeout_s=timeout_s,
            overrides=overrides,
            through_open_transactions=through_open_transactions,
        )
    except KafkaException as exc:
        # The client's own exception (an unreachable cluster, say) becomes the typed one every caller handles.
        raise KafkaClientError(f"cannot read {topic} from {kafka.bootstrap_servers}: {exc.args[0].str()}") from None


def _read_topic(
    kafka: KafkaConfig,
    topic: str,
    *,
    since: datetime | int | None,
    until: datetime | int | None,
    timeout_s: float,
    overrides: Mapping[str, Any] | None,
    through_open_transactions: bool,
) -> Iterator[Message]:
    since_ms, until_ms = _epoch_ms(since), _epoch_ms(until)
    conf = client_config(
        kafka,
        {
            **consumer_defaults(f"distrl-replay-{uuid.uuid4().hex[:12]}", "earliest"),
            "client.id": "distrl-replay",
            # End-of-partition events tell when a partition is done even if its last offsets are transaction markers.
            "enable.partition.eof": True,
        },
        overrides,
    )
    client: confluent_kafka.Consumer = build_client(confluent_kafka.Consumer, conf, "consumer")
    login = login_watch(conf)
    deadline = time.monotonic() + timeout_s
    try:
        # Nothing is assigned yet, so the polls that serve error_cb while it waits cannot swallow a record.
        metadata = login.metadata(client, topic, timeout_s)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise KafkaClientError(
                f"cannot read {topic}: {info.error.str() if info and info.error else 'no such topic'}"
            )
        stop = _high_watermarks(conf, client, topic, list(info.partitions), timeout_s, through_open_transactions)
        if since_ms is None:
            starts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in stop]
        else:
            starts = client.offsets_for_times([TopicPartition(topic, p, since_ms) for p in stop], timeout=timeout_s)
        # offsets_for_times gives -1 where no record is that recent: nothing to read there.
        assignment = [
            tp
            for tp in starts
            if stop[tp.partition] > 0 and (tp.offset == OFFSET_BEGINNING or 0 <= tp.offset < stop[tp.partition])
        ]
        active = {tp.partition for tp in assignment}
        client.assign(assignment)
        while active:
            if time.monotonic() > deadline:
                raise KafkaClientError(
                    f"read of {topic} did not reach the end of partitions {sorted(active)} in {timeout_s:.0f} s"
                )
            msg = client.poll(0.5)
            login.check()
            if msg is None:
                continue
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= stop.get(partition, 0):
                        active.discard(partition)
                elif err.fatal():
                    raise KafkaClientError(f"fatal error reading {topic}: {err.str()}")
                continue
            if msg.offset() >= stop[partition]:
                active.discard(partition)
                continue
            if msg.offset() == stop[partition] - 1:
                active.discard(partition)
            # Producers may set timestamps out of offset order: filter by time, not only by start offset.
            timestamp = msg.timestamp()[1]
            if (since_ms is not None and timestamp < since_ms) or (until_ms is not None and timestamp >= until_ms):
                continue
            yield msg
    finally:
        client.close()


def _high_watermarks(
    conf: dict[str, Any],
    client: confluent_kafka.Consumer,
    topic: str,
    partitions: list[int],
    timeout_s: float,
    through_open_transactions: bool,
) -> dict[int, int]:
    """Partition -> end offset of a read: ``client``'s watermark (its isolation level's), or the high watermark."""
    probe = client
    if through_open_transactions:
        # librdkafka answers a read_committed client with the last stable offset: ask as a read_uncommitted one.
        probe = build_client(confluent_kafka.Consumer, {**conf, "isolation.level": "read_uncommitted"}, "consumer")
    try:
        return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in partitions}
    finally:
        if probe is not client:
            probe.close()


def _epoch_ms(value: datetime | int | None) -> int | None:
    return value if value is None or isinstance(value, int) else epoch_ms(value)
