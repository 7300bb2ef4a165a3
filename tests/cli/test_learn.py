"""`distrl-stream learn` in round mode, through the real CLI: it updates only on complete rounds of one version."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from distrl_stream.config import Config
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode, encode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from tests.learner.simdata import sim_events

pytestmark = pytest.mark.kafka
CLI = str(Path(sys.executable).with_name("distrl-stream"))


def _produce(cfg: Config, events: list[TrajectoryEvent]) -> None:
    with Producer(cfg.kafka, client_id="test-collector") as producer:
        for event in events:
            producer.produce(TopicNames(cfg.run).trajectories, encode(event), key=event.episode_id.encode())
        producer.flush()


def _learner_metrics(cfg: Config) -> list[MetricEvent]:
    events = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    return [e for e in events if e.role == "learner"]


def _versions(cfg: Config) -> list[WeightVersionEvent]:
    return [decode(m.value(), WeightVersionEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).weights)]


def _wait(what: str, predicate: Callable[[], bool], learner: subprocess.Popen[bytes], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert learner.poll() is None, f"learner exited {learner.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_learn_in_round_mode_publishes_one_version_per_complete_round(
    make_config: Callable[..., Config], tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = make_config(model={"base": tiny_model_dir})
    ensure_run_topics(cfg)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    env = {
        **os.environ,
        "DISTRL_LEARNER__BATCH_EPISODES": "2",
        "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "2",
        "DISTRL_LEARNER__METRICS_INTERVAL_S": "0.5",
    }
    flags = ["--run", cfg.run, "-b", cfg.kafka.bootstrap_servers, "--data-dir", str(cfg.data_dir)]
    flags += ["--model", str(tiny_model_dir), "--round-episodes", "3", "--updates-per-version", "2"]
    flags += ["--max-updates", "4", "--threads", "1"]
    with (tmp_path / "learn.log").open("wb") as log:
        learner = subprocess.Popen([CLI, "learn", *flags], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _produce(cfg, sim_events(tokenizer, 2, seed=1, run=cfg.run, version=0))
        # Two of the round's three trajectories are in: the buffer could train, the round learner must not.
        _wait(
            "2 round trajectories",
            lambda: any(e.values.get("round_trajectories") == 2 for e in _learner_metrics(cfg)),
            learner,
        )
        assert all(e.values["updates"] == 0 for e in _learner_metrics(cfg))
        assert _versions(cfg) == []

        _produce(cfg, sim_events(tokenizer, 1, seed=2, run=cfg.run, version=0))
        _wait("version 1", lambda: len(_versions(cfg)) == 1, learner)
        _produce(cfg, sim_events(tokenizer, 3, seed=3, run=cfg.run, version=1))
        assert learner.wait(240) == 0
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
    assert [(v.version, v.learner_step) for v in _versions(cfg)] == [(1, 2), (2, 4)]
