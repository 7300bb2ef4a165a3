"""`distrl-stream collect`: help texts with defaults, and bad values refused with one line and exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import CollectorConfig, load_config
from distrl_stream.errors import ConfigError

runner = CliRunner()


def test_help_explains_each_common_option_with_its_default() -> None:
    result = runner.invoke(app, ["collect", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for flag, default in [
        ("--envs", "8"),
        ("--mode", "async"),
        ("--env", "sim"),
        ("--action-mode", "choice"),
        ("--grace", "30.0"),
        ("--pause-above-policy-lag", "none"),
        ("--metrics-interval", "10.0"),
    ]:
        assert flag in text
        assert f"[default: ({default})]" in text or f"[default: {default}]" in text, flag
    for flag in ("--inference-url", "--run", "--config", "--bootstrap-servers", "--episodes", "--duration"):
        assert flag in text


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--envs", "0"], "collector.envs"),
        (["--mode", "round-robin"], "collector.mode"),
        (["--env", "ios"], "env.kind"),
        (["--grace", "-1"], "collector.shutdown_grace_s"),
        (["--collector-id", "bad id!"], "collector.collector_id"),
        (["--envs", "many"], "--envs"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_option(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["collect", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0], result.output


def test_collector_section_comes_from_the_environment_and_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRL_COLLECTOR__ENVS", "32")
    monkeypatch.setenv("DISTRL_COLLECTOR__MODE", "sync")
    cfg = load_config()
    assert cfg.collector.envs == 32 and cfg.collector.mode == "sync"
    assert CollectorConfig().pause_above_policy_lag is None and CollectorConfig().on_error == "publish"
    monkeypatch.setenv("DISTRL_COLLECTOR__ON_ERROR", "ignore")
    with pytest.raises(ConfigError, match=r"collector\.on_error"):
        load_config()
