"""The explorer's start-up refusals, each one line naming what to change; only the missing run needs a broker."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import Config, KafkaConfig
from distrl_stream.errors import ConfigError, KafkaClientError
from distrl_stream.explorer.server import Explorer, is_loopback

# Nothing listens on port 1: connections are refused at once.
NOWHERE = KafkaConfig(bootstrap_servers="127.0.0.1:1")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("::", False)],
)
def test_loopback_addresses_are_told_apart(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_public_bind_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        Explorer(NOWHERE, "r", tmp_path / "i.sqlite", host="0.0.0.0")
    assert raised.value.field == "--token"


def test_the_cli_says_so_in_one_line() -> None:
    result = CliRunner().invoke(app, ["replay", "explore", "--run", "r", "-b", "127.0.0.1:1", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --token: required when binding 0.0.0.0 (not a loopback address): anyone who reaches it could read "
        "the run"
    ]


@pytest.mark.kafka
def test_a_run_that_does_not_exist_is_named_in_one_line(make_config: Callable[..., Config]) -> None:
    cfg = make_config()
    result = CliRunner().invoke(
        app, ["replay", "explore", "--run", cfg.run, "-b", cfg.kafka.bootstrap_servers, "--port", "0"]
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"error: run {cfg.run}: no topic {cfg.run}.trajectories on {cfg.kafka.bootstrap_servers} "
        "(see `distrl-stream topics list`)"
    ]


def test_a_port_in_use_is_named_before_any_broker_is_asked(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        explorer = Explorer(NOWHERE, "r", tmp_path / "i.sqlite", port=port)
        with pytest.raises(ConfigError) as raised:
            explorer.start()
    assert raised.value.field == "--port" and str(port) in str(raised.value)


def test_an_unreachable_broker_fails_the_start_within_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    explorer = Explorer(NOWHERE, "r", tmp_path / "i.sqlite", port=port, timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(KafkaClientError, match=r"^Kafka at 127\.0\.0\.1:1 did not answer"):
        explorer.start()
    assert time.monotonic() - started < 10
    with socket.socket() as again:  # the port was given back
        again.bind(("127.0.0.1", port))
