"""The per-run topic layout, created on a real broker with the right configs."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from distrl_stream.config import Config, KafkaConfig
from distrl_stream.errors import IncompatibleSchemaError
from distrl_stream.events import EVENT_TYPES, MetricEvent, TrajectoryEvent, default_store
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import Consumer, EventConsumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics, run_topic_specs
from distrl_stream.testing.samples import sample_trajectory
from tests.fixtures.kafka import consume
from tests.fixtures.registry import MockRegistry

DAY_MS = 24 * 3600 * 1000


def test_topic_names_are_prefixed_by_the_run() -> None:
    names = TopicNames("exp-1")
    assert names.all() == ("exp-1.trajectories", "exp-1.weights", "exp-1.artifacts", "exp-1.metrics", "exp-1.dlq")


def test_specs_follow_the_kafka_section() -> None:
    cfg = KafkaConfig(trajectory_partitions=6, replication_factor=3)
    specs = {s.name.rpartition(".")[2]: s for s in run_topic_specs("r", cfg)}
    assert specs["trajectories"].partitions == 6
    assert {s.replication_factor for s in specs.values()} == {3}
    assert {s.config["min.insync.replicas"] for s in specs.values()} == {"2"}
    assert specs["metrics"].config["retention.ms"] == str(cfg.metrics_retention_ms)


@pytest.mark.kafka
def test_ensure_run_topics_creates_the_layout_once(run_config: Config, kafka_admin: Admin) -> None:
    try:
        names = ensure_run_topics(run_config, kafka_admin)
        assert ensure_run_topics(run_config, kafka_admin) == names  # idempotent
        topics = kafka_admin.topics()
        assert topics[names.trajectories] == run_config.kafka.trajectory_partitions
        assert topics[names.weights] == topics[names.artifacts] == topics[names.metrics] == topics[names.dlq] == 1
        assert kafka_admin.describe_topic(names.weights).config["cleanup.policy"] == "compact"
        assert kafka_admin.describe_topic(names.artifacts).config["cleanup.policy"] == "compact"
        metrics = kafka_admin.describe_topic(names.metrics).config
        assert (metrics["cleanup.policy"], metrics["retention.ms"]) == ("delete", str(7 * 24 * 3600 * 1000))
        trajectories = kafka_admin.describe_topic(names.trajectories).config
        assert trajectories["retention.ms"] == "-1"
        assert kafka_admin.describe_topic(names.dlq).config["retention.ms"] == str(28 * DAY_MS)
        assert trajectories["max.message.bytes"] == str(run_config.kafka.max_message_bytes)
    finally:
        assert sorted(delete_run_topics(run_config, kafka_admin)) == sorted(TopicNames(run_config.run).all())
    assert not set(TopicNames(run_config.run).all()) & set(kafka_admin.topics())


@pytest.mark.kafka
def test_each_topic_gets_the_retention_its_config_field_chooses(
    make_config: Callable[..., Config], kafka_admin: Admin
) -> None:
    cfg = make_config(
        kafka={"trajectory_retention_ms": 90 * DAY_MS, "metrics_retention_ms": 2 * DAY_MS, "dlq_retention_ms": DAY_MS}
    )
    try:
        names = ensure_run_topics(cfg, kafka_admin)
        configs = {name: kafka_admin.describe_topic(name).config for name in names.all()}
        assert configs[names.trajectories]["retention.ms"] == str(90 * DAY_MS)
        assert configs[names.metrics]["retention.ms"] == str(2 * DAY_MS)
        assert configs[names.dlq]["retention.ms"] == str(DAY_MS)
        assert configs[names.weights]["cleanup.policy"] == "compact"
    finally:
        delete_run_topics(cfg, kafka_admin)


@pytest.mark.kafka
def test_creating_a_runs_topics_registers_its_schemas_and_records_carry_registry_ids(
    make_config: Callable[..., Config], kafka_admin: Admin, mock_registry: MockRegistry
) -> None:
    for i in range(10):  # other subjects first: the run's ids cannot be the static ids 1-5
        mock_registry.client.register_schema(f"other-{i}-value", Schema(json.dumps({"type": "string"}), "AVRO"))
    cfg = make_config(kafka={"schema_registry_url": mock_registry.url})
    try:
        names = ensure_run_topics(cfg, kafka_admin)
        client = mock_registry.client
        ids = {cls: client.get_latest_version(f"{names.of(cls)}-value").schema_id for cls in EVENT_TYPES}
        assert min(ids.values()) > 10
        assert {client.get_compatibility(f"{names.of(cls)}-value") for cls in EVENT_TYPES} == {"BACKWARD_TRANSITIVE"}

        ours = sample_trajectory(random.Random(3))
        theirs = sample_trajectory(random.Random(4))
        serializer = AvroSerializer(client, default_store().latest(TrajectoryEvent.AVRO_NAME).schema_str)
        context = SerializationContext(names.trajectories, MessageField.VALUE)
        with Producer(cfg.kafka) as producer:
            producer.produce_event(names.trajectories, ours)
            producer.produce(names.trajectories, serializer(theirs.to_avro(), context), theirs.episode_id)
        raw = Consumer(cfg.kafka)
        events = EventConsumer(Consumer(cfg.kafka), None, expect=TrajectoryEvent)
        try:
            raw.assign_from_start(names.trajectories)
            events.consumer.assign_from_start(names.trajectories)
            values = {msg.key(): msg.value() for msg in consume(raw, 2)}
            decoded = {received.event.episode_id: received.event for received in consume(events, 2)}
        finally:
            raw.close()
            events.consumer.close()
        written = values[ours.episode_id.encode()]
        assert written[0] == 0 and int.from_bytes(written[1:5], "big") == ids[TrajectoryEvent]
        assert TrajectoryEvent.from_avro(AvroDeserializer(client)(written, context)) == ours
        assert decoded == {ours.episode_id: ours, theirs.episode_id: theirs}
    finally:
        delete_run_topics(cfg, kafka_admin)


@pytest.mark.kafka
def test_an_incompatible_schema_stops_start_up_before_any_topic_is_created(
    make_config: Callable[..., Config], kafka_admin: Admin, mock_registry: MockRegistry
) -> None:
    cfg = make_config(kafka={"schema_registry_url": mock_registry.url})
    subject = f"{TopicNames(cfg.run).metrics}-value"
    # Registered earlier: a MetricEvent without source_id, which our schema (no default for it) cannot read.
    older = json.loads(default_store().latest(MetricEvent.AVRO_NAME).schema_str)
    older["fields"] = [f for f in older["fields"] if f["name"] != "source_id"]
    mock_registry.client.register_schema(subject, Schema(json.dumps(older), "AVRO"))
    with pytest.raises(IncompatibleSchemaError) as info:
        ensure_run_topics(cfg, kafka_admin)
    assert info.value.subject == subject and subject in str(info.value)
    assert not set(TopicNames(cfg.run).all()) & set(kafka_admin.topics())
