"""A SASL_SSL + SCRAM-SHA-512 cluster: the roles reach it through ``kafka.client``, and a refused login is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from distrl_stream.config import Config, KafkaConfig, load_config
from distrl_stream.errors import BrokerError, KafkaAuthenticationError
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.broker import BrokerSecurity
from distrl_stream.kafka.client import LoginWatch, client_config
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import delete_run_topics, ensure_run_topics
from tests.fixtures.kafka import consume
from tests.fixtures.secured_kafka import USER, USER_PASSWORD, SecuredBroker, write_certificates

REFUSED = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed during authentication "
    "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 388ms in state AUTH_REQ)"
)


def test_a_refused_login_becomes_one_line_naming_user_mechanism_and_address() -> None:
    kafka = KafkaConfig(
        bootstrap_servers="127.0.0.1:9093",
        client={"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER, "sasl.password": USER_PASSWORD},
    )
    seen: list[KafkaError] = []
    watch = LoginWatch(client_config(kafka, {}), seen.append)
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    watch.check()  # not a login failure: librdkafka's retries may still succeed
    watch(KafkaError(KafkaError._AUTHENTICATION, REFUSED))
    with pytest.raises(KafkaAuthenticationError) as raised:
        watch.check()
    message = str(raised.value)
    assert message == (
        "Kafka authentication failed for user alice (SCRAM-SHA-512) at 127.0.0.1:9093: "
        "invalid credentials (wrong user name or password)"
    )
    assert len(seen) == 2, "the wrapper's own error_cb still sees every error"


def test_every_client_config_has_the_login_watch_chained_to_the_wrappers_callback() -> None:
    producer = Producer(KafkaConfig())
    watch = producer.config["error_cb"]
    assert isinstance(watch, LoginWatch) and watch.chained == producer._on_error
    assert isinstance(Consumer(KafkaConfig(), group_id="g").config["error_cb"], LoginWatch)
    assert isinstance(Admin(KafkaConfig()).config["error_cb"], LoginWatch)


def test_broker_security_writes_a_sasl_ssl_listener_and_scram_users(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path / "k.pem", tmp_path / "ca.pem", users={"admin": "a-pw", USER: "b-pw"})
    props = security.server_properties(9093, 9094)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert 'username="admin" password="a-pw"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert security.format_arguments() == [
        "--add-scram",
        "SCRAM-SHA-512=[name=admin,password=a-pw]",
        "--add-scram",
        "SCRAM-SHA-512=[name=alice,password=b-pw]",
    ]
    assert "b-pw" not in repr(security)
    with pytest.raises(BrokerError, match="inter_broker_user 'root'"):
        BrokerSecurity(tmp_path / "k.pem", tmp_path / "ca.pem", users={USER: "x"}, inter_broker_user="root")


@pytest.fixture
def secured_config(secured_broker: SecuredBroker, tmp_path: Path, unique_name: Callable[[str], str]) -> Config:
    """A fresh run on the SASL_SSL broker, logging in as alice."""
    return load_config(
        None,
        run=unique_name("sec"),
        data_dir=tmp_path / "distrl-data",
        kafka={"bootstrap_servers": secured_broker.bootstrap_servers, "client": secured_broker.client()},
    )


@pytest.mark.kafka
def test_topics_are_created_and_records_round_trip_over_sasl_ssl(secured_config: Config) -> None:
    names = ensure_run_topics(secured_config)
    try:
        with Producer(secured_config.kafka) as producer:
            for i in range(3):
                producer.produce(names.metrics, f"value-{i}".encode(), key=f"k{i}")
            assert producer.flush(30.0).delivered == 3
        with Consumer(secured_config.kafka, group_id=f"{secured_config.run}-g") as consumer:
            consumer.subscribe([names.metrics])
            got = consume(consumer, 3, timeout_s=60.0)
        assert sorted(m.value() for m in got) == [b"value-0", b"value-1", b"value-2"]
    finally:
        delete_run_topics(secured_config)


def _cli(args: list[str], client: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DISTRL_KAFKA__CLIENT": json.dumps(client)}
    return subprocess.run(
        [sys.executable, "-m", "distrl_stream.cli", *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.kafka
def test_the_topics_cli_creates_and_lists_a_run_on_the_secured_cluster_from_the_environment(
    secured_broker: SecuredBroker, unique_name: Callable[[str], str]
) -> None:
    run = unique_name("seccli")
    where = ["--run", run, "-b", secured_broker.bootstrap_servers, "--timeout", "60"]
    try:
        created = _cli(["topics", "create", *where], secured_broker.client(), timeout_s=180)
        assert created.returncode == 0, created.stderr
        listed = _cli(["topics", "list", *where], secured_broker.client(), timeout_s=180)
        assert listed.returncode == 0, listed.stderr
        assert f"{run}.trajectories" in listed.stdout
        assert USER_PASSWORD not in listed.stdout + listed.stderr + created.stdout + created.stderr
    finally:
        kafka = {"bootstrap_servers": secured_broker.bootstrap_servers, "client": secured_broker.client()}
        delete_run_topics(load_config(None, run=run, kafka=kafka))


@pytest.mark.kafka
def test_a_wrong_password_is_one_line_and_exit_2_long_before_the_timeout(secured_broker: SecuredBroker) -> None:
    wrong = "not-alices-pw-93b1"
    # --timeout 600: waiting for it (librdkafka's own behaviour) would blow the subprocess deadline.
    started = time.monotonic()
    result = _cli(
        ["topics", "list", "-b", secured_broker.bootstrap_servers, "--timeout", "600"],
        secured_broker.client(password=wrong),
        timeout_s=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: Kafka authentication failed for user alice (SCRAM-SHA-512) at 127.0.0.1:")
    assert "invalid credentials" in lines[0]
    assert wrong not in result.stdout + result.stderr
    assert elapsed < 120


@pytest.mark.kafka
def test_an_untrusted_broker_certificate_is_a_tls_error_not_a_timeout(
    secured_broker: SecuredBroker, tmp_path: Path
) -> None:
    _keystore, other_ca = write_certificates(tmp_path)
    client = {**secured_broker.client(), "ssl.ca.location": str(other_ca)}
    admin = Admin(KafkaConfig(bootstrap_servers=secured_broker.bootstrap_servers, client=client), timeout_s=600)
    with pytest.raises(KafkaAuthenticationError, match=r"^TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed: .*"):
        admin.topics()


@pytest.mark.kafka
def test_a_producer_with_a_wrong_password_fails_its_flush_instead_of_waiting(secured_broker: SecuredBroker) -> None:
    kafka = KafkaConfig(
        bootstrap_servers=secured_broker.bootstrap_servers, client=secured_broker.client(password="wrong-pw")
    )
    producer = Producer(kafka)
    producer.produce("any-topic", b"x")
    with pytest.raises(KafkaAuthenticationError, match="for user alice"):
        producer.flush(600.0)
    producer.close(0.1)
