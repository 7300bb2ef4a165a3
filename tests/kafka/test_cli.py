"""`distrl-stream topics ...` and `distrl-stream kafka status` through the real CLI app."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import Config

runner = CliRunner()


@pytest.mark.kafka
def test_topics_create_list_describe_delete(run_config: Config) -> None:
    flags = ["--run", run_config.run, "-b", run_config.kafka.bootstrap_servers]
    created = runner.invoke(app, ["topics", "create", *flags])
    assert created.exit_code == 0, created.output
    assert f"{run_config.run}.weights" in created.output

    listed = runner.invoke(app, ["topics", "list", *flags])
    assert listed.exit_code == 0, listed.output
    for kind in ("trajectories", "weights", "artifacts", "metrics", "dlq"):
        assert f"{run_config.run}.{kind}" in listed.output

    described = runner.invoke(app, ["topics", "describe", *flags, "--json"])
    assert described.exit_code == 0, described.output
    info = json.loads(described.output)
    assert info[f"{run_config.run}.weights"]["config"]["cleanup.policy"] == "compact"
    assert len(info[f"{run_config.run}.trajectories"]["partitions"]) == run_config.kafka.trajectory_partitions

    deleted = runner.invoke(app, ["topics", "delete", *flags, "--yes"])
    assert deleted.exit_code == 0, deleted.output
    assert "deleted 5 topics" in deleted.output
    gone = runner.invoke(app, ["topics", "describe", *flags])
    assert gone.exit_code == 1
    assert "has no topics" in gone.output


def test_topics_against_an_unreachable_cluster_fail_with_one_line() -> None:
    result = runner.invoke(app, ["topics", "list", "-b", "127.0.0.1:1", "--timeout", "1"])
    assert result.exit_code == 1
    assert "did not answer" in result.output


def test_kafka_status_of_a_data_dir_without_a_broker_exits_3(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kafka", "status", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 3
    status = json.loads(result.output)
    assert status["running"] is False
    assert status["run_dir"] == str((tmp_path / "kafka").resolve())


def test_kafka_stop_without_a_broker_says_so(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kafka", "stop", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "no Kafka broker running" in result.output


@pytest.mark.parametrize(
    "command", [["kafka", "start"], ["kafka", "install"], ["topics", "list"], ["topics", "delete"]]
)
def test_help_documents_every_option(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    options = [line for line in result.output.splitlines() if line.strip().startswith("│ --")]
    assert options
    for line in options:
        assert len(line.split("  ")) > 2, f"undocumented option: {line}"


@pytest.mark.kafka
def test_kafka_start_finds_the_installation_setup_recorded_without_kafka_home(
    kafka_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shell after `make setup`: no KAFKA_HOME (only the Makefile sets it), no release in the user cache.
    monkeypatch.delenv("KAFKA_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "venv").mkdir()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))  # where the record lives: this environment
    data = ["--data-dir", str(tmp_path / "data")]
    missing = runner.invoke(app, ["kafka", "start", *data])
    assert missing.exit_code == 1 and "no Apache Kafka installation" in missing.output
    used = runner.invoke(app, ["kafka", "use", str(kafka_home)])  # what scripts/setup.sh runs
    assert used.exit_code == 0, used.output
    try:
        started = runner.invoke(app, ["kafka", "start", *data])
        assert started.exit_code == 0, started.output
    finally:
        runner.invoke(app, ["kafka", "stop", *data])
