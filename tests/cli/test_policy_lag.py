"""The two policy-lag limits and the algorithm list on the command line: each flag reaches its config field."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
from typer.testing import CliRunner

import distrl_stream.collector
import distrl_stream.learner.role
from distrl_stream.cli.learn import ReplayAlgorithm
from distrl_stream.cli.main import app
from distrl_stream.config import ALGORITHMS, Config
from distrl_stream.errors import DistrlError

runner = CliRunner()


def _capture(into: list[Config]) -> Any:
    def run(cfg: Config, *_args: Any, **_kwargs: Any) -> NoReturn:
        into.append(cfg)
        raise DistrlError("stopped by the test")

    return run


def test_collect_flag_sets_the_collector_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Config] = []
    monkeypatch.setattr(distrl_stream.collector, "run_collector", _capture(seen))
    runner.invoke(app, ["collect", "--pause-above-policy-lag", "2"])
    assert [cfg.collector.pause_above_policy_lag for cfg in seen] == [2]
    assert seen[0].learner.drop_above_policy_lag == 10


def test_learn_flag_sets_the_learner_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Config] = []
    monkeypatch.setattr(distrl_stream.learner.role, "run_learner", _capture(seen))
    runner.invoke(app, ["learn", "--drop-above-policy-lag", "3"])
    assert [cfg.learner.drop_above_policy_lag for cfg in seen] == [3]
    assert seen[0].collector.pause_above_policy_lag is None


def test_up_offers_both_limits_with_their_defaults() -> None:
    result = runner.invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())

    def option_help(flag: str) -> str:
        return text.split(f" {flag} ", 1)[1].split(" --", 1)[0]

    assert "[default: (none)]" in option_help("--pause-above-policy-lag")
    assert "[default: (10)]" in option_help("--drop-above-policy-lag")


def test_replay_algorithms_are_every_algorithm_and_online_ones_exclude_bc() -> None:
    assert tuple(ReplayAlgorithm) == ALGORITHMS == ("aride", "digirl", "filtered_bc", "bc")
    result = runner.invoke(app, ["learn", "--algorithm", "bc"])
    assert result.exit_code == 2 and "learner.algorithm" in result.output
