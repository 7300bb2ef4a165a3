"""Every librdkafka property of Config.kafka.client reaches every client: producer, consumer, admin, replay."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import Config, KafkaConfig, is_secret_property, load_config
from distrl_stream.errors import ConfigError, KafkaClientError
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


def test_eager_group_settings_pass_in_any_spelling_librdkafka_reads() -> None:
    eager = {"group.protocol": " Classic", "partition.assignment.strategy": "range,roundrobin"}
    assert Consumer(KafkaConfig(client=eager), group_id="g").config["group.protocol"] == " Classic"


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


# An EC key encrypted with KEY_PASSWORD and its self-signed certificate: librdkafka decrypts the key when it builds an
# SSL client (no broker needed), so a client that builds proves the real password reached it.
KEY_PASSWORD = "pw-Zq8-never-printed"
KEY_PEM = """-----BEGIN ENCRYPTED PRIVATE KEY-----
MIH0MF8GCSqGSIb3DQEFDTBSMDEGCSqGSIb3DQEFDDAkBBAxj6eNJBglOH8y8TLQ
CNSHAgIIADAMBggqhkiG9w0CCQUAMB0GCWCGSAFlAwQBKgQQ1/uE/ahXdZzjFK7O
wMpQQwSBkFtxZNRsH8rdaH3vTSCPPJDdmKc2r7CEoxNxjjX3IgS7jm7P9ut2LWbo
YCtkOE6IrF/kEQswjNGj5yNHdQp7h2yUtkbJzTmKlygE8BV6Fo3LSNjPD7CKiPbJ
hqJLsLxsbTNazzqVmb3cCLY9ZWzHlLRpHYg935dE7fUVYWN2SvXnJBRdVOdxFRm4
uIe4tL39lA==
-----END ENCRYPTED PRIVATE KEY-----"""
CERT_PEM = """-----BEGIN CERTIFICATE-----
MIIBGjCBwaADAgECAgEBMAoGCCqGSM49BAMCMBYxFDASBgNVBAMMC2Rpc3RybC10
ZXN0MCAXDTI0MDEwMTAwMDAwMFoYDzIxMjMxMjA4MDAwMDAwWjAWMRQwEgYDVQQD
DAtkaXN0cmwtdGVzdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABO5SA8b6QVD+
5k0iPxF2h07MV91KqHSQVqPBGBfbQcFsyzsA5DtUE0H6cUZP+BKGxibFywFH7c+R
/5hsE7Wxk1AwCgYIKoZIzj0EAwIDSAAwRQIhAPbrVX/E+994xiF0I+9x8h6iE024
vDnZE/d+VX0vC8q5AiACM4cpk8iE6LlFmMF+Vl2l4LkKmb4aZznCEhj5Som7AQ==
-----END CERTIFICATE-----"""
KEY_BODY = KEY_PEM.splitlines()[1]


def _secured_env(monkeypatch: pytest.MonkeyPatch, password: str = KEY_PASSWORD, **extra: str) -> None:
    client = {"security.protocol": "SSL", "ssl.key.pem": KEY_PEM, "ssl.certificate.pem": CERT_PEM}
    monkeypatch.setenv("DISTRL_KAFKA__CLIENT", json.dumps({**client, "ssl.key.password": password, **extra}))


def test_passwords_and_keys_are_secret_properties() -> None:
    secret = ["sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem",
              "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "https.client.key.pem"]  # fmt: skip
    public = ["sasl.username", "ssl.certificate.pem", "ssl.ca.location", "security.protocol", "client.rack"]
    assert [p for p in secret if not is_secret_property(p)] == []
    assert [p for p in public if is_secret_property(p)] == []


def test_a_password_from_the_environment_is_masked_in_config_show(monkeypatch: pytest.MonkeyPatch) -> None:
    _secured_env(monkeypatch, **{"sasl.password": "sasl-pw-never-printed"})
    result = CliRunner().invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    for secret in (KEY_PASSWORD, "sasl-pw-never-printed", KEY_BODY):
        assert secret not in result.output
    client = json.loads(result.stdout)["kafka"]["client"]
    assert (client["ssl.key.password"], client["sasl.password"], client["ssl.key.pem"]) == ("**********",) * 3
    assert client["ssl.certificate.pem"] == CERT_PEM  # public material stays readable


def test_a_password_from_the_environment_reaches_librdkafka_but_never_its_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _secured_env(monkeypatch, debug="conf,security")
    kafka = load_config().kafka
    assert repr(kafka).count("**********") == 2 and KEY_PASSWORD not in repr(kafka)
    with caplog.at_level(logging.DEBUG, logger="distrl_stream"):
        producer = Producer(kafka, client_id="secret-test")
        producer.poll(0.5)  # the client built: librdkafka decrypted the key with the real password
        producer.close(0)
    assert "ssl.key.password" in caplog.text  # librdkafka did log its configuration
    assert KEY_PASSWORD not in caplog.text and KEY_BODY not in caplog.text


def test_a_password_from_the_environment_never_appears_in_error_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    _secured_env(monkeypatch, password="wrong-pw-never-printed")
    with pytest.raises(KafkaClientError, match=r"ssl\.key\.pem") as client_error:
        _ = Producer(load_config().kafka).client
    assert "wrong-pw-never-printed" not in str(client_error.value) and KEY_BODY not in str(client_error.value)
    monkeypatch.setenv("DISTRL_KAFKA__CLIENT", '{"sasl.password": 20240917}')
    with pytest.raises(ConfigError, match=r"kafka\.client\.sasl\.password") as config_error:
        load_config()
    assert "20240917" not in str(config_error.value)
