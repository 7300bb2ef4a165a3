"""A typed admin client: topics in, typed answers out, every call bounded by a timeout."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec, ResourceType

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import KafkaClientError
from distrl_stream.kafka.client import build_client, client_config, login_watch

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create: name, partitions, replication and topic-level configs (``cleanup.policy``...)."""

    name: str
    partitions: int
    replication_factor: int = 1
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: leader broker id, replica count, and its low/high watermark offsets."""

    partition: int
    leader: int
    replicas: int
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the cluster says about a topic: partitions with offsets, and its non-default configs."""

    name: str
    partitions: list[PartitionInfo]
    config: dict[str, str]

    @property
    def messages(self) -> int:
        """Records currently retained (high - low summed over partitions; compaction can make it an upper bound)."""
        return sum(p.high - p.low for p in self.partitions)


class Admin:
    """A thin wrapper over ``confluent_kafka.admin.AdminClient``.

    Args:
        kafka: cluster address and extra librdkafka properties (``kafka.client``).
        timeout_s: bound on each operation.
        overrides: librdkafka properties that win over everything else.
    """

    def __init__(
        self, kafka: KafkaConfig, *, timeout_s: float = 30.0, overrides: Mapping[str, Any] | None = None
    ) -> None:
        self.kafka = kafka
        self.timeout_s = timeout_s
        # Every wait ends in a typed error that says what failed, so the errors it polls on the way are only debug.
        defaults = {"client.id": "distrl-admin", "error_cb": lambda err: log.debug("admin client: %s", err.str())}
        self.config = client_config(kafka, defaults, overrides)
        self._login = login_watch(self.config)
        self._client: AdminClient | None = None

    @property
    def client(self) -> AdminClient:
        """The underlying confluent-kafka admin client (created on first access)."""
        if self._client is None:
            self._client = build_client(AdminClient, self.config, "admin client")
        return self._client

    def topics(self) -> dict[str, int]:
        """Every topic of the cluster (internal ones excluded) with its partition count."""
        metadata = self._metadata()
        return {name: len(t.partitions) for name, t in metadata.topics.items() if not name.startswith("__")}

    def create_topics(self, specs: Iterable[TopicSpec], *, exist_ok: bool = True) -> list[str]:
        """Create topics and wait until every partition has a leader; returns the names actually created.

        Raises:
            KafkaClientError: the cluster refused one (bad config, too few brokers), or it exists and not ``exist_ok``.
        """
        specs = list(specs)
        if not specs:
            return []
        new = [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config)) for s in specs]
        futures = self.client.create_topics(new, request_timeout=self.timeout_s)
        created = []
        for name, future in futures.items():
            try:
                self._login.result(self.client, future, self.timeout_s)
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if not (exist_ok and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                    raise KafkaClientError(f"cannot create topic {name}: {err.str()}") from None
            except TimeoutError:
                raise KafkaClientError(
                    f"cannot create topic {name}: Kafka at {self.kafka.bootstrap_servers} "
                    f"did not answer within {self.timeout_s:.0f} s"
                ) from None
        self._wait_until_usable([s.name for s in specs])
        return created

    def delete_topics(self, names: Sequence[str], *, missing_ok: bool = True) -> list[str]:
        """Delete topics; returns the names actually deleted.

        Raises:
            KafkaClientError: the cluster refused, or a topic is missing and not ``missing_ok``.
        """
        if not names:
            return []
        futures = self.client.delete_topics(list(names), request_timeout=self.timeout_s)
        deleted = []
        for name, future in futures.items():
            try:
                self._login.result(self.client, future, self.timeout_s)
                deleted.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if not (missing_ok and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise KafkaClientError(f"cannot delete topic {name}: {err.str()}") from None
            except TimeoutError:
                raise KafkaClientError(
                    f"cannot delete topic {name}: Kafka at {self.kafka.bootstrap_servers} "
                    f"did not answer within {self.timeout_s:.0f} s"
                ) from None
        self._wait_until_gone(deleted)
        return deleted

    def describe_topic(self, name: str) -> TopicInfo:
        """Partitions (leader, replicas, watermarks) and the topic's explicitly set configs.

        Raises:
            KafkaClientError: no such topic, or the cluster did not answer.
        """
        metadata = self._metadata(name)
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            reason = topic.error.str() if topic is not None and topic.error is not None else "no such topic"
            raise KafkaClientError(f"cannot describe topic {name}: {reason}")
        resource = ConfigResource(ResourceType.TOPIC, name)
        try:
            future = self.client.describe_configs([resource], request_timeout=self.timeout_s)[resource]
            entries = self._login.result(self.client, future, self.timeout_s)
        except KafkaException as exc:
            raise KafkaClientError(f"cannot read configs of {name}: {exc.args[0].str()}") from None
        config = {k: e.value for k, e in entries.items() if not e.is_default and e.value is not None}
        ids = sorted(topic.partitions)
        low = self._offsets(name, ids, OffsetSpec.earliest())
        high = self._offsets(name, ids, OffsetSpec.latest())
        partitions = [
            PartitionInfo(pid, topic.partitions[pid].leader, len(topic.partitions[pid].replicas), low[pid], high[pid])
            for pid in ids
        ]
        return TopicInfo(name, partitions, config)

    def topic_ids(self, names: Sequence[str]) -> dict[str, str]:
        """Topic name -> the id the cluster gave it when it was created: a topic deleted and created again under the
        same name gets a new one, so a reader that recorded offsets can tell they no longer apply.

        Raises:
            KafkaClientError: a topic does not exist, or the cluster did not answer.
        """
        futures = self.client.describe_topics(TopicCollection(list(names)), request_timeout=self.timeout_s)
        ids = {}
        for name, future in futures.items():
            try:
                ids[name] = str(self._login.result(self.client, future, self.timeout_s).topic_id)
            except (KafkaException, TimeoutError) as exc:
                reason = exc.args[0].str() if isinstance(exc, KafkaException) else "timed out"
                raise KafkaClientError(f"cannot describe topic {name}: {reason}") from None
        return ids

    def committed_offsets(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Partition -> the offset ``group`` committed on ``topic`` (negative where it committed none), read
        without joining the group.

        Raises:
            KafkaClientError: the cluster did not answer or refused the request.
        """
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
        try:
            future = self.client.list_consumer_group_offsets([request], request_timeout=self.timeout_s)[group]
            answer = self._login.result(self.client, future, self.timeout_s)
        except KafkaException as exc:
            raise KafkaClientError(f"cannot read the offsets of group {group}: {exc.args[0].str()}") from None
        return {tp.partition: tp.offset for tp in answer.topic_partitions}

    def wait_until_ready(self, timeout_s: float | None = None) -> int:
        """Poll until the cluster answers with at least one broker; returns the broker count.

        Raises:
            KafkaClientError: no answer within ``timeout_s`` (default: the admin's timeout).
        """
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                metadata = self._login.metadata(self.client, None, min(1.0, max(0.1, deadline - time.monotonic())))
                if metadata.brokers:
                    return len(metadata.brokers)
            except KafkaException as exc:
                last = exc.args[0].str()
        raise KafkaClientError(f"Kafka at {self.kafka.bootstrap_servers} did not answer in time ({last})")

    def _metadata(self, topic: str | None = None) -> Any:
        try:
            return self._login.metadata(self.client, topic, self.timeout_s)
        except KafkaException as exc:
            raise KafkaClientError(
                f"Kafka at {self.kafka.bootstrap_servers} did not answer: {exc.args[0].str()}"
            ) from None

    def _offsets(self, name: str, partitions: Sequence[int], spec: OffsetSpec) -> dict[int, int]:
        """Offsets of partitions per ``spec``, retrying while a new topic's partitions are still getting leaders."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            request = {TopicPartition(name, p): spec for p in partitions}
            try:
                futures = self.client.list_offsets(request, request_timeout=self.timeout_s)
                return {
                    tp.partition: self._login.result(self.client, f, self.timeout_s).offset for tp, f in futures.items()
                }
            except KafkaException as exc:
                err = exc.args[0]
                if not _transient(err) or time.monotonic() > deadline:
                    raise KafkaClientError(f"cannot read offsets of {name}: {err.str()} ({err.name()})") from None
            time.sleep(0.1)  # leadership moves in the background; there is no event to wait on

    def _wait_until_usable(self, names: Sequence[str]) -> None:
        # CreateTopics returns once the controller has the topic; a client that starts at once can still get
        # UNKNOWN_TOPIC_OR_PART or NOT_LEADER until every partition's leader serves it. Answering ListOffsets is
        # the proof that it does.
        for name in names:
            deadline = time.monotonic() + self.timeout_s
            while True:
                topic = self._metadata(name).topics.get(name)
                if topic is not None and topic.error is None and topic.partitions:
                    self._offsets(name, sorted(topic.partitions), OffsetSpec.latest())
                    break
                if time.monotonic() > deadline:
                    raise KafkaClientError(f"topic {name} is not available after {self.timeout_s:.0f} s")
                time.sleep(0.1)

    def _wait_until_gone(self, names: Sequence[str]) -> None:
        # Deletion completes in the background; until the metadata drops a topic, recreating it fails.
        deadline = time.monotonic() + self.timeout_s
        while set(names) & set(self._metadata().topics):
            if time.monotonic() > deadline:
                raise KafkaClientError(f"topics {sorted(names)} still listed {self.timeout_s:.0f} s after deletion")
            time.sleep(0.1)


# Errors a topic shows while it is being created or moved: retrying shortly succeeds.
_TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader whose high watermark is not known yet
        KafkaError.UNKNOWN_LEADER_EPOCH,  # the client's metadata is ahead of the broker's
        KafkaError.FENCED_LEADER_EPOCH,  # ... or behind it
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


def _transient(err: KafkaError) -> bool:
    return err.retriable() or err.code() in _TRANSIENT_CODES
