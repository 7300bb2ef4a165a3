"""docker/: the compose file parses, has the promised topology, runs real CLI invocations, and its config validates.

No Docker engine runs here, so this is what can be checked without one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import load_config

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
ROLES = [name for name, s in SERVICES.items() if str(s.get("image", "")).startswith("distrl-stream")]
runner = CliRunner()


def _interpolate(value: Any) -> Any:
    """Compose's ${VAR:-default} with nothing set in the environment: the default."""
    if isinstance(value, str):
        return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)
    return value


def _mounted_file(service: dict[str, Any], target: str) -> Path:
    for volume in service.get("volumes", []):
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target and source.startswith("./"):
            return DOCKER / source
    raise AssertionError(f"{target} is not mounted from docker/")


def test_three_broker_kraft_cluster_with_replication_3_and_min_isr_2() -> None:
    brokers = {name: s for name, s in SERVICES.items() if str(s.get("image", "")).startswith("apache/kafka")}
    assert len(brokers) == 3
    ids = set()
    for name, service in brokers.items():
        env = {k: _interpolate(v) for k, v in service["environment"].items()}
        ids.add(env["KAFKA_NODE_ID"])
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
        assert sorted(v.split("@")[1].split(":")[0] for v in voters) == sorted(brokers)
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == 3 and env["KAFKA_MIN_INSYNC_REPLICAS"] == 2
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
        assert f"//{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert ids == {1, 2, 3}


def test_gpu_server_learner_and_scalable_collectors() -> None:
    gpu = SERVICES["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert SERVICES["vllm"]["build"]["args"]["EXTRAS"] == "gpu"
    assert SERVICES["learner"]["command"][0] == "learn"
    assert SERVICES["collector"]["command"][0] == "collect" and SERVICES["collector"]["deploy"]["replicas"] >= 1
    assert (DOCKER / "Dockerfile").read_text().count("ENTRYPOINT") == 1


def _command(args: list[str]) -> tuple[Any, list[str]]:
    """The click command an argv names, and the arguments left for it."""
    command: Any = typer.main.get_command(app)
    args = list(args)
    while hasattr(command, "commands"):
        command = command.commands[args.pop(0)]
    return command, args


@pytest.mark.parametrize("service", ROLES)
def test_service_command_is_a_real_invocation(service: str) -> None:
    argv = [str(a) for a in SERVICES[service]["command"]]
    assert runner.invoke(app, [*argv, "--help"]).exit_code == 0
    command, rest = _command(argv)
    # Parse every argument as the command would (unknown options and bad values fail here) without running it.
    ctx = command.make_context(command.name, rest)
    assert ctx.params.get("config") == Path("/etc/distrl/distrl.toml")


@pytest.mark.parametrize("service", ROLES)
def test_service_config_validates(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SERVICES[service]
    for name in [k for k in os.environ if k.startswith("DISTRL_")]:
        monkeypatch.delenv(name)
    for name, value in spec["environment"].items():
        monkeypatch.setenv(name, str(_interpolate(value)))
    cfg = load_config(_mounted_file(spec, "/etc/distrl/distrl.toml"))
    assert cfg.kafka.bootstrap_servers == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    assert cfg.kafka.replication_factor == 3
    assert cfg.inference.base_url == "http://vllm:8000"
    assert cfg.data_dir == Path("/data") and cfg.run == "cluster"
    assert any(v.endswith(":/data") for v in spec["volumes"])  # adapters travel through the shared data volume
