"""`distrl-stream eval` through the real CLI, on the session's broker and vLLM server: a run with two published
versions evaluated by number, `latest` and a range; the report's numbers against the episodes that ran and the metric
events on the run's topic; bad --versions and --run give one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from distrl_stream.collector.evaluation import wilson_interval
from distrl_stream.collector.heldout import EvalPlan, run_evaluation
from distrl_stream.config import Config, ModelConfig
from distrl_stream.events import MetricEvent, decode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.testing.instant_learner import publish_version, write_noop_adapter
from tests.fixtures.vllm import VllmService

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]
CLI = str(Path(sys.executable).with_name("distrl-stream"))
TEMPLATES = ["take_photo", "alarm_on"]


@pytest.fixture
def published_run(make_config: Callable[..., Config], vllm_server: VllmService, tmp_path: Path) -> Config:
    """A run with versions 1 and 2 published (a no-op LoRA adapter: the base model's behaviour, real sha256s)."""
    cfg = make_config(
        model={"base": vllm_server.model_dir},
        env={"templates": TEMPLATES},
        inference={"url": vllm_server.url, "request_timeout_s": 20.0},
    )
    ensure_run_topics(cfg)
    adapter = write_noop_adapter(vllm_server.model_dir, tmp_path / "noop", ModelConfig())
    with Producer(cfg.kafka) as producer:
        for version in (1, 2):
            publish_version(cfg, producer, version, adapter)
        producer.flush()
    return cfg


def eval_cli(cfg: Config, vllm_server: VllmService, *flags: str) -> subprocess.CompletedProcess[str]:
    args = [CLI, "eval", "--run", cfg.run, "-b", cfg.kafka.bootstrap_servers, "--server-url", vllm_server.url]
    args += ["--model", str(cfg.model.base), *flags]
    env = {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_ENV__TEMPLATES": json.dumps(TEMPLATES),
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "20",
    }
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)


def eval_metrics(cfg: Config) -> list[MetricEvent]:
    events = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    return [e for e in events if e.role == "eval"]


def check_counts(result: dict[str, Any], tasks: int, episodes_per_task: int) -> None:
    """The numbers of one version's result are those of the episodes that ran."""
    episodes = tasks * episodes_per_task
    assert result["episodes"] == episodes and result["errors"] == 0, result
    assert result["versions_seen"] == [result["version"]]  # every action by the version evaluated
    assert len(result["by_task"]) == tasks
    assert all(c["episodes"] == episodes_per_task for c in result["by_task"].values())
    assert set(result["by_template"]) <= set(TEMPLATES)
    for counts in (result["by_template"], result["by_task"]):
        assert sum(c["episodes"] for c in counts.values()) == episodes
        assert sum(c["successes"] for c in counts.values()) == result["successes"]
    assert result["success_rate"] == result["successes"] / episodes
    assert result["interval"] == pytest.approx(list(wilson_interval(result["successes"], episodes)))


def test_eval_of_the_base_model_and_the_latest_version_reports_what_ran(
    published_run: Config, vllm_server: VllmService, tmp_path: Path
) -> None:
    out = tmp_path / "report" / "eval.json"
    done = eval_cli(published_run, vllm_server, "--versions", "0,latest", "-n", "3", "-k", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["split"] == "test" and report["tasks"] == 3 and report["episodes_per_task"] == 2
    assert [r["version"] for r in report["results"]] == [0, 2]
    for result in report["results"]:
        check_counts(result, tasks=3, episodes_per_task=2)
        low, high = result["interval"]
        line = f"v{result['version']}: {result['success_rate']:.1%} ({low:.1%}-{high:.1%}), "
        assert line + f"{result['successes']}/6 episodes, 0 errors" in done.stdout
    markdown = out.with_suffix(".md").read_text()
    first_task = next(iter(report["results"][0]["by_task"]))
    assert "\n| 2 | " in markdown and "Wilson" in markdown and f"| `{first_task}` | " in markdown
    # One metric event per version, with the report's numbers.
    events = eval_metrics(published_run)
    assert [e.values["policy_version"] for e in events] == [0.0, 2.0]
    for event, result in zip(events, report["results"], strict=True):
        assert event.labels["split"] == "test" and event.labels["env_kind"] == "sim"
        assert event.values["episodes"] == 6 and event.values["successes"] == result["successes"]
        assert (event.values["ci_low"], event.values["ci_high"]) == pytest.approx(result["interval"])
        for template, counts in result["by_template"].items():
            assert event.values[f"successes.{template}"] == counts["successes"]
            assert event.values[f"episodes.{template}"] == counts["episodes"]


def test_eval_of_a_range_loads_each_version_in_turn_into_the_report_in_the_run_folder(
    published_run: Config, vllm_server: VllmService
) -> None:
    done = eval_cli(published_run, vllm_server, "--versions", "1-2", "-n", "2", "--split", "train", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [r["version"] for r in report["results"]] == [1, 2] and report["split"] == "train"
    for result in report["results"]:
        check_counts(result, tasks=2, episodes_per_task=1)
    [written] = (published_run.run_dir / "eval").glob("*-train.json")
    assert json.loads(written.read_text()) == report
    assert [e.values["policy_version"] for e in eval_metrics(published_run)] == [1.0, 2.0]
    # Every adapter loaded for the evaluation is gone again: the server serves the base model alone.
    served = httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in served] == ["policy-v0"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--versions", "3"], "error: --versions: version 3 was never published (published: 1-2)"),
        (["--versions", "2-1"], "error: --versions: '2-1': a range runs from the lower version to the higher"),
    ],
)
def test_eval_of_a_version_that_does_not_exist_is_one_line_naming_the_flag(
    published_run: Config, vllm_server: VllmService, flags: list[str], message: str
) -> None:
    done = eval_cli(published_run, vllm_server, *flags)
    assert done.returncode == 2 and done.stderr.strip() == message, done.stderr
    assert eval_metrics(published_run) == []


def test_eval_of_an_unknown_run_is_one_line_naming_the_flag(
    make_config: Callable[..., Config], vllm_server: VllmService
) -> None:
    cfg = make_config(model={"base": vllm_server.model_dir})
    done = eval_cli(cfg, vllm_server, "--versions", "0")
    assert done.returncode == 2, done.stderr
    where = f"{cfg.kafka.bootstrap_servers} (no topic {cfg.run}.weights)"
    assert done.stderr.strip() == f"error: --run: no run '{cfg.run}' at {where}"


def test_what_the_server_serves_now_is_measured_and_published_as_up_measures_it(
    published_run: Config, vllm_server: VllmService
) -> None:
    (result,) = run_evaluation(published_run, EvalPlan(tasks=2), [None], vllm_server.url)
    assert result.version == 0 and result.episodes == 2  # nothing loaded: the base model is what is served
    [event] = eval_metrics(published_run)
    assert event.values["policy_version"] == 0 and event.values["episodes"] == 2
