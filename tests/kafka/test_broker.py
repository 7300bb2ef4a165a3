"""The embedded broker's lifecycle through the CLI: install, start, status from another process, stop, restart."""

from __future__ import annotations

import json
import re
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import KafkaConfig
from distrl_stream.errors import BrokerError
from distrl_stream.kafka.admin import Admin, TopicSpec
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import Consumer, read_topic
from distrl_stream.kafka.producer import Producer
from tests.fixtures.kafka import consume

pytestmark = pytest.mark.kafka
runner = CliRunner()


@pytest.fixture(scope="module")
def installed_home(kafka_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """KAFKA_HOME packed like an official release archive, then installed by `kafka install --from`."""
    work = tmp_path_factory.mktemp("kafka-release")
    archive = work / "kafka_2.13-4.4.0.tgz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(kafka_home / "libs", arcname="kafka_2.13-4.4.0/libs")
    result = runner.invoke(app, ["kafka", "install", "--from", str(archive), "--cache-dir", str(work / "cache")])
    assert result.exit_code == 0, result.output
    home = Path(re.search(r"export KAFKA_HOME=(\S+)", result.output).group(1))  # type: ignore[union-attr]
    assert home == work / "cache" / "kafka_2.13-4.4.0"
    return home


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose broker is stopped whatever the test does."""
    yield tmp_path
    EmbeddedBroker(tmp_path / "kafka").stop()


def _cli(*args: str, home: Path) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"KAFKA_HOME": str(home)})
    return result.exit_code, result.output


def test_broker_restart_keeps_data_and_committed_offsets(installed_home: Path, data_dir: Path) -> None:
    code, out = _cli("kafka", "start", "--data-dir", str(data_dir), home=installed_home)
    assert code == 0, out
    bootstrap = re.search(r"DISTRL_KAFKA__BOOTSTRAP_SERVERS=(\S+)", out).group(1)  # type: ignore[union-attr]

    code, out = _cli("kafka", "status", "--data-dir", str(data_dir), "--json", home=installed_home)
    status = json.loads(out)
    assert code == 0 and status["running"] and status["bootstrap_servers"] == bootstrap
    assert status["installation"] == "kafka_2.13-4.4.0" and status["kafka_home"] == str(installed_home)

    kafka = KafkaConfig(bootstrap_servers=bootstrap)
    Admin(kafka).create_topics([TopicSpec("persist", 2)])
    with Producer(kafka) as producer:
        for i in range(100):
            producer.produce("persist", f"v{i}".encode(), key=str(i))
        producer.flush()
    with Consumer(kafka, group_id="keeper") as consumer:
        consumer.subscribe(["persist"])
        for msg in consume(consumer, 100)[:40]:
            consumer.processed(msg)
        consumer.commit()

    code, out = _cli("kafka", "stop", "--data-dir", str(data_dir), home=installed_home)
    assert code == 0 and "stopped" in out
    code, out = _cli("kafka", "status", "--data-dir", str(data_dir), home=installed_home)
    assert code == 3 and "not running" in out

    code, out = _cli("kafka", "start", "--data-dir", str(data_dir), home=installed_home)
    assert code == 0, out
    assert f"={bootstrap}" in out  # same ports: configs that name the address keep working

    assert sorted(m.value().decode() for m in read_topic(kafka, "persist")) == sorted(f"v{i}" for i in range(100))
    with Consumer(kafka, group_id="keeper") as consumer:
        consumer.subscribe(["persist"])
        assert len(consume(consumer, 60)) == 60
        assert consumer.poll(1.0) is None

    code, out = _cli("kafka", "stop", "--data-dir", str(data_dir), home=installed_home)
    assert code == 0 and "stopped" in out


def test_a_broker_that_cannot_start_reports_its_log_tail(kafka_home: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(tmp_path / "kafka", kafka_home=kafka_home, port=taken.getsockname()[1])
        with pytest.raises(BrokerError) as info:
            broker.start()
    assert "Address already in use" in info.value.log_tail
    assert "broker log tail" in str(info.value)
    assert not broker.status().running


def test_start_without_a_kafka_installation_says_how_to_get_one(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "kafka", kafka_home=tmp_path / "not-kafka")
    with pytest.raises(BrokerError, match="not an Apache Kafka installation"):
        broker.start()
