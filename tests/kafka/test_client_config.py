"""Every librdkafka property of Config.kafka.client reaches every client: producer, consumer, admin, replay."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from distrl_stream.config import Config, KafkaConfig, load_config
from distrl_stream.errors import KafkaClientError
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import Consumer, read_topic
from distrl_stream.kafka.producer import Producer

SECURED = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "learner",
    "sasl.password": "s3cret",
    "ssl.ca.location": "/etc/ssl/certs/ca.pem",
    "client.rack": "rack-7",
}


def test_client_properties_reach_producer_consumer_and_admin_configs() -> None:
    kafka = KafkaConfig(bootstrap_servers="broker:9093", client=SECURED)
    configs = {
        "producer": Producer(kafka).config,
        "consumer": Consumer(kafka, group_id="g").config,
        "admin": Admin(kafka).config,
    }
    for name, conf in configs.items():
        assert conf["bootstrap.servers"] == "broker:9093", name
        for key, value in SECURED.items():
            assert conf[key] == value, f"{name}: {key}"


def test_client_properties_come_from_the_environment_and_the_config_file(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "distrl.toml"  # type: ignore[operator]
    toml.write_text('[kafka.client]\n"sasl.mechanism" = "PLAIN"\n"client.rack" = "from-file"\n')
    assert Producer(load_config(toml).kafka).config["client.rack"] == "from-file"
    monkeypatch.setenv("DISTRL_KAFKA__CLIENT", '{"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"}')
    conf = Consumer(load_config().kafka, group_id="g").config
    assert (conf["security.protocol"], conf["ssl.ca.location"]) == ("SSL", "/ca.pem")


def test_user_properties_override_the_wrapper_defaults_and_call_overrides_win() -> None:
    kafka = KafkaConfig(client={"compression.type": "zstd", "enable.auto.commit": "true"})
    assert Producer(kafka).config["compression.type"] == "zstd"
    assert Consumer(kafka, group_id="g").config["enable.auto.commit"] == "true"
    assert Producer(kafka, overrides={"compression.type": "gzip"}).config["compression.type"] == "gzip"


def test_wrapper_defaults_are_the_documented_ones() -> None:
    producer = Producer(KafkaConfig()).config
    assert (producer["enable.idempotence"], producer["acks"], producer["compression.type"]) == (True, "all", "lz4")
    consumer = Consumer(KafkaConfig(), group_id="g").config
    assert consumer["enable.auto.commit"] is False
    assert consumer["enable.auto.offset.store"] is False
    assert consumer["auto.offset.reset"] == "earliest"


@pytest.mark.kafka
def test_librdkafka_receives_the_properties_of_every_client(run_config: Config) -> None:
    # librdkafka validates every property when a client is built: a bad value fails each client type, which proves
    # the properties are handed to librdkafka and not only kept in a dict.
    bad = KafkaConfig(bootstrap_servers=run_config.kafka.bootstrap_servers, client={"security.protocol": "bogus"})
    attempts: dict[str, Callable[[], object]] = {
        "producer": lambda: Producer(bad).produce("t", b"x"),
        "consumer": lambda: Consumer(bad, group_id="g").poll(0),
        "admin": lambda: Admin(bad).topics(),
        "replay": lambda: list(read_topic(bad, "t")),
    }
    for name, attempt in attempts.items():
        with pytest.raises(
            KafkaClientError, match=re.escape('Invalid value "bogus" for configuration property "security.protocol"')
        ):
            attempt()
        assert name


@pytest.mark.kafka
def test_a_client_property_is_visible_to_the_broker(
    run_config: Config, make_topic: Callable[..., str], unique_name: Callable[[str], str], kafka_admin: Admin
) -> None:
    topic = make_topic()
    group = unique_name("group")
    kafka = KafkaConfig(bootstrap_servers=run_config.kafka.bootstrap_servers, client={"client.id": "rack7-learner"})
    with Consumer(kafka, group_id=group) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.client.assignment():
            assert time.monotonic() < deadline, "never got an assignment"
            consumer.poll(0.2)
        description = kafka_admin.client.describe_consumer_groups([group])[group].result(timeout=10)
    assert [m.client_id for m in description.members] == ["rack7-learner"]
