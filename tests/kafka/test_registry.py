"""Schema Registry mode: the compatibility check, registration, both serdes reading each other, failures, config."""

from __future__ import annotations

import base64
import json
import random
import socket
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from distrl_stream.config import KafkaConfig, load_config
from distrl_stream.errors import (
    ConfigError,
    EventDecodeError,
    EventEncodeError,
    IncompatibleSchemaError,
    RegistryUnavailableError,
)
from distrl_stream.events import EVENT_TYPES, MetricEvent, Serde, TrajectoryEvent, default_serde, default_store
from distrl_stream.kafka.registry import RegistrySerde, check_backward_transitive, subject_name, use_schemas
from distrl_stream.testing.samples import sample_dead_letter, sample_metric, sample_trajectory, sample_weight_version
from tests.fixtures.http import BackgroundHttpServer, JsonHandler
from tests.fixtures.registry import MockRegistry

SAMPLES = {
    "TrajectoryEvent": sample_trajectory,
    "WeightVersionEvent": sample_weight_version,
    "MetricEvent": sample_metric,
    "DeadLetter": sample_dead_letter,
}
TOPICS = {cls: f"r.{cls.__name__}" for cls in EVENT_TYPES}


def record(name: str, *fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "t", "fields": list(fields)})


def test_backward_transitive_accepts_an_added_field_with_a_default() -> None:
    v1 = record("R", {"name": "a", "type": "int"})
    v2 = record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""})
    check_backward_transitive("s-value", v2, [(1, v1)])
    check_backward_transitive("s-value", v2, [(1, v1), (2, v2)])


def test_backward_transitive_refuses_a_field_without_default_naming_the_subject_and_version() -> None:
    v1 = record("R", {"name": "a", "type": "int"})
    v2 = record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "string"})
    with pytest.raises(IncompatibleSchemaError) as info:
        check_backward_transitive("run.metrics-value", v2, [(1, v1)])
    assert info.value.subject == "run.metrics-value"
    message = str(info.value)
    assert message.startswith("run.metrics-value: ") and "version 1" in message and "b" in message
    assert "\n" not in message


def test_backward_transitive_checks_every_registered_version_not_only_the_latest() -> None:
    v1 = record("R", {"name": "a", "type": "int"})
    v2 = record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""})
    v3 = record("R", {"name": "a", "type": "int"}, {"name": "b", "type": "string"})  # reads v2 data, not v1's
    check_backward_transitive("s-value", v3, [(2, v2)])
    with pytest.raises(IncompatibleSchemaError, match="version 1"):
        check_backward_transitive("s-value", v3, [(1, v1), (2, v2)])


def test_our_schema_history_is_backward_transitive() -> None:
    store = default_store()
    for cls in EVENT_TYPES:
        versions = [(e.version, e.schema_str) for e in store if e.name == cls.AVRO_NAME]
        check_backward_transitive(cls.__name__, store.latest(cls.AVRO_NAME).schema_str, versions)


def padded(mock_registry: MockRegistry, count: int = 10) -> None:
    """Fill the registry with unrelated schemas, so that our ids cannot be the static ids 1-5 by chance."""
    for i in range(count):
        mock_registry.client.register_schema(f"other-{i}-value", Schema(record(f"Other{i}"), "AVRO"))


def test_registration_uses_topic_subjects_registry_ids_and_backward_transitive(mock_registry: MockRegistry) -> None:
    padded(mock_registry)
    serde = use_schemas(KafkaConfig(schema_registry_url=mock_registry.url))
    assert default_serde() is serde
    ids = serde.register(TOPICS)
    client = mock_registry.client
    for cls, topic in TOPICS.items():
        subject = subject_name(topic)
        assert subject == f"{topic}-value"
        assert client.get_latest_version(subject).schema_id == ids[cls] > 10
        assert client.compatibility[subject] == "BACKWARD_TRANSITIVE"
        data = serde.encode(SAMPLES[cls.__name__](random.Random(1)))
        assert data[0] == 0 and int.from_bytes(data[1:5], "big") == ids[cls]
    assert serde.register(TOPICS) == ids  # idempotent: the same schemas keep their ids


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_confluent_deserializer_reads_what_we_write_with_registry_ids(mock_registry: MockRegistry, cls: type) -> None:
    padded(mock_registry)
    serde = use_schemas(KafkaConfig(schema_registry_url=mock_registry.url))
    serde.register(TOPICS)
    event = SAMPLES[cls.__name__](random.Random(5))
    context = SerializationContext(TOPICS[cls], MessageField.VALUE)
    assert cls.from_avro(AvroDeserializer(mock_registry.client)(serde.encode(event), context)) == event


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_we_read_what_confluents_serializer_writes(mock_registry: MockRegistry, cls: type) -> None:
    padded(mock_registry)
    serializer = AvroSerializer(mock_registry.client, default_store().latest(cls.AVRO_NAME).schema_str)
    event = SAMPLES[cls.__name__](random.Random(6))
    data = serializer(event.to_avro(), SerializationContext(TOPICS[cls], MessageField.VALUE))
    # A reader that registered nothing: the id is looked up in the registry.
    reader = RegistrySerde(mock_registry.client, mock_registry.url)
    assert reader.decode(data, cls) == event


def test_an_older_version_written_by_confluents_serializer_resolves_to_the_current_one(
    mock_registry: MockRegistry,
) -> None:
    v1 = default_store().by_id(3)  # MetricEvent v1, without labels
    assert v1 is not None and v1.version == 1
    serializer = AvroSerializer(mock_registry.client, v1.schema_str)
    event = sample_metric(random.Random(2))
    body = {k: v for k, v in event.to_avro().items() if k != "labels"}
    data = serializer(body, SerializationContext("r.metrics", MessageField.VALUE))
    decoded = RegistrySerde(mock_registry.client, mock_registry.url).decode(data, MetricEvent)
    assert decoded == MetricEvent(**{**body, "labels": {}})


def test_an_id_the_registry_does_not_know_is_an_unknown_schema_id(mock_registry: MockRegistry) -> None:
    serde = RegistrySerde(mock_registry.client, mock_registry.url)
    with pytest.raises(EventDecodeError) as info:
        serde.decode(b"\x00\x00\x00\x03\xe7payload")
    assert (info.value.reason, info.value.schema_id) == ("unknown schema id", 999)


def test_a_writer_that_registered_nothing_refuses_to_encode(mock_registry: MockRegistry) -> None:
    serde = RegistrySerde(mock_registry.client, mock_registry.url)
    with pytest.raises(EventEncodeError, match="register the run's schemas first"):
        serde.encode(sample_metric(random.Random(1)))


def test_an_incompatible_change_is_refused_naming_the_subject(mock_registry: MockRegistry) -> None:
    # A registered writer without source_id: our current schema (source_id has no default) cannot read its data.
    current = json.loads(default_store().latest("distrl.MetricEvent").schema_str)
    current["fields"] = [f for f in current["fields"] if f["name"] != "source_id"]
    mock_registry.client.register_schema("r.MetricEvent-value", Schema(json.dumps(current), "AVRO"))
    serde = use_schemas(KafkaConfig(schema_registry_url=mock_registry.url))
    with pytest.raises(IncompatibleSchemaError) as info:
        serde.register(TOPICS)
    assert info.value.subject == "r.MetricEvent-value"
    assert "source_id" in str(info.value) and "\n" not in str(info.value)
    assert mock_registry.client.get_versions("r.MetricEvent-value") == [1]  # nothing was registered after it


def test_a_registry_conflict_maps_to_the_same_error(
    mock_registry: MockRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def conflict(subject: str, schema: Schema, normalize_schemas: bool = False) -> int:
        raise SchemaRegistryError(409, 409, "Schema being registered is incompatible with an earlier schema")

    monkeypatch.setattr(mock_registry.client, "register_schema", conflict)
    with pytest.raises(IncompatibleSchemaError) as info:
        use_schemas(KafkaConfig(schema_registry_url=mock_registry.url)).register(TOPICS)
    assert info.value.subject == "r.TrajectoryEvent-value"
    assert "incompatible with an earlier schema" in str(info.value)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_registry_is_one_line_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("distrl_stream.kafka.registry._serdes", {})
    monkeypatch.setattr("distrl_stream.events.serde._default", default_serde())
    url = f"http://reg:s3cret@127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(RegistryUnavailableError) as info:
        use_schemas(KafkaConfig(schema_registry_url=url, schema_registry_timeout_s=2)).register(TOPICS)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "cannot be reached" in message and "\n" not in message
    # The URL is named with its password masked.
    assert url.replace("s3cret", "**********") in message and "s3cret" not in message


class RecordingRegistry(JsonHandler):
    """Just enough of the registry's REST API for registration, recording each request's Authorization header."""

    seen: ClassVar[list[tuple[str, str, str | None, Any]]] = []

    def do_GET(self) -> None:
        self._record()
        self.send_json(404, {"error_code": 40401, "message": "Subject not found"})

    def do_PUT(self) -> None:
        self.send_json(200, self._record())

    def do_POST(self) -> None:
        self._record()
        self.send_json(200, {"id": 100 + len(self.seen)})

    def _record(self) -> Any:
        data = self.read_json()
        self.seen.append((self.command, self.path.partition("?")[0], self.headers.get("Authorization"), data))
        return data


@pytest.fixture
def recording_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr("distrl_stream.kafka.registry._serdes", {})
    monkeypatch.setattr("distrl_stream.events.serde._default", default_serde())
    RecordingRegistry.seen = []
    with BackgroundHttpServer(RecordingRegistry) as server:
        yield server.url


def test_an_http_registry_gets_basic_auth_and_the_same_calls(recording_registry: str) -> None:
    kafka = KafkaConfig(schema_registry_url=recording_registry, schema_registry_basic_auth="alice:s3cret")
    ids = use_schemas(kafka).register({MetricEvent: "r.metrics"})
    assert ids == {MetricEvent: 103}
    seen = RecordingRegistry.seen
    assert [(method, path) for method, path, _, _ in seen] == [
        ("GET", "/subjects/r.metrics-value/versions"),
        ("PUT", "/config/r.metrics-value"),
        ("POST", "/subjects/r.metrics-value/versions"),
    ]
    assert seen[1][3] == {"compatibility": "BACKWARD_TRANSITIVE"}
    assert json.loads(seen[2][3]["schema"]) == default_store().latest("distrl.MetricEvent").schema
    assert {auth for _, _, auth, _ in seen} == {"Basic " + base64.b64encode(b"alice:s3cret").decode()}


def test_registry_settings_are_config_fields_and_the_credentials_stay_masked() -> None:
    cfg = load_config(kafka={"schema_registry_url": "https://sr:8081", "schema_registry_basic_auth": "bob:pw-xyz"})
    assert cfg.kafka.schema_registry_basic_auth is not None
    assert cfg.kafka.schema_registry_basic_auth.get_secret_value() == "bob:pw-xyz"
    assert "pw-xyz" not in json.dumps(cfg.model_dump(mode="json")) and "pw-xyz" not in repr(cfg)
    with pytest.raises(ConfigError) as info:
        load_config(kafka={"schema_registry_basic_auth": "no-colon-pw-xyz"})
    assert info.value.field == "kafka.schema_registry_basic_auth" and "pw-xyz" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(kafka={"schema_registry_url": "registry:8081"})
    assert info.value.field == "kafka.schema_registry_url"


def test_without_a_registry_url_the_static_ids_remain() -> None:
    serde = use_schemas(KafkaConfig())
    assert type(serde) is Serde and default_serde() is serde
    assert serde.schema_id(TrajectoryEvent) == 9
