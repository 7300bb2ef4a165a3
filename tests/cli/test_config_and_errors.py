"""Configuration precedence through the CLI, and bad input: one line naming the field and what is allowed, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.common import parse_time
from distrl_stream.cli.main import app
from distrl_stream.config import load_config
from distrl_stream.errors import ConfigError

runner = CliRunner()


def _show(*args: str, env: dict[str, str] | None = None) -> dict:
    result = runner.invoke(app, ["config", "show", *args], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_precedence_is_defaults_then_file_then_environment_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('run = "from-file"\n[kafka]\ncompression = "zstd"\ntrajectory_partitions = 6\n')
    assert _show()["kafka"]["compression"] == "lz4"
    from_file = _show("--config", str(toml))
    assert (from_file["run"], from_file["kafka"]["compression"]) == ("from-file", "zstd")
    env = {"DISTRL_KAFKA__COMPRESSION": "gzip", "DISTRL_RUN": "from-env"}
    from_env = _show("--config", str(toml), env=env)
    assert (from_env["run"], from_env["kafka"]["compression"]) == ("from-env", "gzip")
    assert from_env["kafka"]["trajectory_partitions"] == 6  # the file still sets what the environment does not
    from_flag = _show("--config", str(toml), "--run", "from-flag", env=env)
    assert from_flag["run"] == "from-flag" and from_flag["kafka"]["compression"] == "gzip"


BAD_INPUT = [
    pytest.param(["config", "show"], {"DISTRL_KAFKA__COMPRESSION": "brotli"}, "kafka.compression", "'lz4'", id="env"),
    pytest.param(["config", "show", "--run", "no spaces"], {}, "run", "pattern", id="flag-value"),
    pytest.param(["up", "--mode", "lockstep", "--help-not"], {}, "--help-not", "No such option", id="unknown-option"),
    pytest.param(["monitor", "--history", "soon"], {}, "--history", "number", id="flag-type"),
    pytest.param(["replay", "export", "x.parquet", "--per", "day"], {}, "--per", "'episode'", id="choice"),
    pytest.param(["replay", "stats", "--since", "yesterday"], {}, "--since", "ISO 8601", id="time"),
    pytest.param(["replay", "export", "x.csv"], {}, "--format", "parquet or jsonl", id="format"),
    pytest.param(["collect", "--envs", "0"], {}, "collector.envs", "greater than or equal to 1", id="range"),
    pytest.param(["collect", "--inference-url", "gpu-0:8000"], {}, "inference.urls", "http(s)://", id="url"),
    pytest.param(["config", "show", "--config", "/nonexistent.toml"], {}, "--config", "no such file", id="file"),
    pytest.param(["nonsense"], {}, "nonsense", "No such command", id="command"),
    pytest.param(["serve", "--model", "/nonexistent"], {}, "model.base", "no such folder", id="model-path"),
    pytest.param(["collect"], {"DISTRL_MODEL__BASE": "smollm2"}, "model.base", "smollm2-135m-instruct", id="model"),
    pytest.param(["serve", "--model", "Qwen/Qwen2.5-0.5B"], {}, "model.base", "hub id", id="model-hub-id"),
    pytest.param(
        ["learn"],
        {"DISTRL_KAFKA__CLIENT": '{"partition.assignment.strategy": "cooperative-sticky"}'},
        "kafka.client",
        "partition.assignment.strategy 'cooperative-sticky'",
        id="incremental-assignment",
    ),
    pytest.param(
        ["learn"],
        {"DISTRL_KAFKA__CLIENT": '{"group.protocol": "CONSUMER"}'},
        "kafka.client",
        "group.protocol",
        id="kip848",
    ),
]


@pytest.mark.parametrize(("args", "env", "field", "allowed"), BAD_INPUT)
def test_bad_input_is_one_line_naming_the_field_and_exit_2(
    args: list[str], env: dict[str, str], field: str, allowed: str
) -> None:
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert field in lines[0] and allowed in lines[0]
    assert "Traceback" not in result.output


def test_a_mistyped_model_is_one_line_naming_the_closest_known_names_before_anything_starts(tmp_path: Path) -> None:
    # Before this was checked, transformers took the name for a hub id and retried the hub for ~51 s.
    result = runner.invoke(app, ["up", "--model", "smollm2-135m", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: model.base: 'smollm2-135m' is neither a folder nor a known pretrained model: no such folder; known, "
        "closest first: smollm2-135m-instruct (`distrl-stream model list`)"
    ]
    assert not (tmp_path / "data").exists()


def test_an_unknown_browsergym_task_is_one_line_naming_the_setting_before_anything_starts(tmp_path: Path) -> None:
    env = {"DISTRL_ENV__BROWSERGYM_TASKS": '["browsergym/miniwob.click-tset"]'}
    result = runner.invoke(app, ["up", "--env", "browsergym", "--data-dir", str(tmp_path / "data")], env=env)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]  # after the profile up prints
    assert "Traceback" not in result.output
    assert line.startswith("error: env.browsergym_tasks: no BrowserGym task 'browsergym/miniwob.click-tset' (closest: ")
    assert "browsergym/miniwob.click-test" in line
    assert not (tmp_path / "data").exists()


def test_clients_use_the_list_of_servers_else_the_single_url_else_host_and_port(tmp_path: Path) -> None:
    toml = tmp_path / "servers.toml"
    toml.write_text('[inference]\nurl = "http://one:8000/"\n')
    assert load_config(toml).inference.server_urls == ("http://one:8000",)
    toml.write_text('[inference]\nurl = "http://one:8000"\nurls = ["http://gpu-0:8000", "http://gpu-1:8000/"]\n')
    assert load_config(toml).inference.server_urls == ("http://gpu-0:8000", "http://gpu-1:8000")
    assert load_config().inference.server_urls == ("http://127.0.0.1:8000",)


def test_a_bad_value_in_the_config_file_names_the_field(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text("[inference]\ndevice = 'tpu'\n")
    result = runner.invoke(app, ["serve", "--config", str(toml)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "inference.device" in result.output and "'gpu'" in result.output


def test_artifacts_must_keep_at_least_the_versions_a_server_keeps_loaded() -> None:
    with pytest.raises(
        ConfigError, match=r"artifacts.keep_versions \(2\) must be at least inference.keep_versions \(3\)"
    ):
        load_config(artifacts={"keep_versions": 2}, inference={"keep_versions": 3})
    assert load_config(artifacts={"keep_versions": 3}, inference={"keep_versions": 3}).artifacts.keep_versions == 3


def test_the_installed_command_prints_no_traceback_on_bad_input(tmp_path: Path) -> None:
    # The real entry point (not the test runner): what a user's shell sees.
    env = {**os.environ, "DISTRL_ENV__KIND": "desktop"}
    done = subprocess.run(
        [sys.executable, "-m", "distrl_stream.cli", "up", "--duration", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "env.kind" in done.stderr and "'sim'" in done.stderr
    assert not (tmp_path / "distrl-data").exists()  # validated before anything started


def test_times_are_iso_or_an_age() -> None:
    now = parse_time("2025-01-02T03:04:05+00:00", "--since")
    assert now is not None and now.isoformat() == "2025-01-02T03:04:05+00:00"
    naive = parse_time("2025-01-02T03:04", "--since")
    assert naive is not None and naive.utcoffset() is not None and naive.utcoffset().total_seconds() == 0
    assert parse_time("90s", "--since", now=now) == parse_time("1.5m", "--since", now=now)
    assert (now - parse_time("2h", "--since", now=now)).total_seconds() == 7200
    with pytest.raises(ConfigError, match="--until"):
        parse_time("last week", "--until")


def test_credentials_in_urls_and_storage_options_are_masked_and_none_may_sit_in_the_store_url() -> None:
    env = {
        "DISTRL_INFERENCE__URLS": '["http://alice:s3cret-a@gpu-1:8000", "http://gpu-2:8000?api_key=s3cret-b"]',
        "DISTRL_ENV__JUDGE_URL": "http://judge:s3cret-c@host:8000/v1",
        "DISTRL_KAFKA__SCHEMA_REGISTRY_URL": "https://reg:s3cret-d@registry:8081",
        "DISTRL_ARTIFACTS__STORE": "s3://bucket/prefix",
        "DISTRL_ARTIFACTS__STORAGE_OPTIONS": '{"key": "s3cret-e", "secret": "s3cret-f", "endpoint_url": "http://minio"}',
    }
    result = runner.invoke(app, ["config", "show"], env=env)
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.stdout
    shown = json.loads(result.stdout)
    assert shown["inference"]["urls"] == ["http://alice:**********@gpu-1:8000", "http://gpu-2:8000?api_key=**********"]
    assert shown["env"]["judge_url"] == "http://judge:**********@host:8000/v1"
    assert shown["artifacts"]["storage_options"]["endpoint_url"] == "http://minio"
    cfg = load_config(None, artifacts={"storage_options": {"key": "k", "secret": "s", "client_kwargs": {"token": "t"}}})
    assert cfg.artifacts.storage_options_values() == {"key": "k", "secret": "s", "client_kwargs": {"token": "t"}}
    # The store's URL is on every weight-version event: credentials there are refused, without echoing them.
    result = runner.invoke(app, ["config", "show"], env={"DISTRL_ARTIFACTS__STORE": "https://u:p4ss@store.lab/x"})
    assert result.exit_code == 2 and "artifacts.store" in result.output and "p4ss" not in result.output
