"""`distrl-stream collect`: help texts with defaults, and bad values refused with one line and exit 2."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from distrl_stream import collector
from distrl_stream.cli.main import app
from distrl_stream.collector import CollectorReport
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


def test_a_collector_that_could_not_work_exits_1_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` reports a child's non-zero exit with the first error line of its log: this line."""
    failed = CollectorReport(
        collector_id="c0",
        mode="async",
        episodes=0,
        by_termination={},
        published=0,
        delivered=0,
        dropped=0,
        publish_failures=0,
        undelivered=0,
        abandoned_ids=(),
        rounds=0,
        duration_s=1.0,
        stop_reason="failed: slot 0: KafkaAuthenticationError: SASL authentication failed",
        failure="slot 0: KafkaAuthenticationError: SASL authentication failed",
    )
    monkeypatch.setattr(collector, "run_collector", lambda cfg: failed)
    result = runner.invoke(app, ["collect"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == (
        "error: collector c0 could not collect: slot 0: KafkaAuthenticationError: SASL authentication failed"
    )
    monkeypatch.setattr(collector, "run_collector", lambda cfg: dataclasses.replace(failed, failure=None))
    assert runner.invoke(app, ["collect"]).exit_code == 0
