"""Helpers of the collector tests: configs pointing at the session's broker and vLLM server, topic readers, the CLI
as a subprocess, and the structural check every published trajectory must pass."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from distrl_stream.config import Config, ModelConfig
from distrl_stream.events import MetricEvent, Termination, TrajectoryEvent, decode
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import Consumer, read_topic
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.testing.instant_learner import write_noop_adapter
from tests.fixtures.vllm import VllmService

CLI = str(Path(sys.executable).with_name("distrl-stream"))
ENDED = (Termination.SUCCESS, Termination.FAILURE, Termination.TRUNCATED)


@pytest.fixture
def collector_config(make_config: Callable[..., Config], vllm_server: VllmService) -> Callable[..., Config]:
    """``collector_config(collector={...}, env={...}, inference={...})``: a fresh run on the session's services."""

    def make(**overrides: Any) -> Config:
        inference = {"url": vllm_server.url, "request_timeout_s": 20.0, **overrides.pop("inference", {})}
        collector = {"metrics_interval_s": 1.0, "version_refresh_s": 0.2, **overrides.pop("collector", {})}
        return make_config(inference=inference, collector=collector, **overrides)

    return make


@pytest.fixture(scope="module")
def noop_adapter(vllm_server: VllmService, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real LoRA adapter folder (B = 0) to publish as new versions."""
    return write_noop_adapter(vllm_server.model_dir, tmp_path_factory.mktemp("adapters") / "noop", ModelConfig())


@pytest.fixture
def weight_watcher(vllm_server: VllmService) -> Iterator[Callable[[Config], WeightWatcher]]:
    """``weight_watcher(cfg)`` starts the real watcher hot-loading cfg's versions into the session server; at the end
    it is stopped and every adapter unloaded, so later tests see only version 0."""
    started: list[WeightWatcher] = []

    def start(cfg: Config) -> WeightWatcher:
        watcher = WeightWatcher(cfg, server_url=vllm_server.url)
        watcher.start()
        started.append(watcher)
        return watcher

    yield start
    for watcher in started:
        watcher.stop()
    vllm_server.unload_all_adapters()


def trajectories(cfg: Config) -> list[TrajectoryEvent]:
    """Every trajectory of the run (all partitions up to their end), checking each record's key."""
    out = []
    for msg in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories, timeout_s=60):
        event = decode(msg.value(), TrajectoryEvent)
        assert msg.key() == event.episode_id.encode()
        out.append(event)
    return out


def metrics(cfg: Config) -> list[MetricEvent]:
    """Every collector MetricEvent of the run, oldest first."""
    events = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    return [e for e in events if e.role == "collector"]


class TopicWatch:
    """Follows a topic from its beginning without a group; ``wait(n)`` polls until n records arrived."""

    def __init__(self, cfg: Config, topic: str, partitions: int) -> None:
        self.consumer = Consumer(cfg.kafka, client_id="test-watch")
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.values: list[bytes] = []

    def poll(self, timeout_s: float = 0.2) -> None:
        msg = self.consumer.poll(timeout_s)
        if msg is not None:
            self.values.append(msg.value())

    def wait(self, count: int, timeout_s: float, alive: Callable[[], None] | None = None) -> None:
        """Poll until ``count`` records; ``alive`` may fail the test early (e.g. the process under test died)."""
        deadline = time.monotonic() + timeout_s
        while len(self.values) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"{len(self.values)} of {count} records within {timeout_s:.0f}s")
            if alive is not None:
                alive()
            self.poll(0.5)

    async def wait_async(self, predicate: Callable[[list[bytes]], bool], timeout_s: float) -> None:
        """Poll (off the event loop) until ``predicate(values)`` holds."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.values):
            if time.monotonic() > deadline:
                pytest.fail(f"condition not met within {timeout_s:.0f}s ({len(self.values)} records)")
            await asyncio.to_thread(self.poll, 0.5)

    def close(self) -> None:
        self.consumer.close()


def trajectory_watch(cfg: Config) -> TopicWatch:
    return TopicWatch(cfg, TopicNames(cfg.run).trajectories, cfg.kafka.trajectory_partitions)


def start_cli(cfg: Config, log_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`distrl-stream collect` for ``cfg``'s run as a subprocess; stdout (the --json report) is piped, logs go to
    ``log_path``."""
    args = [CLI, "collect", "--run", cfg.run, "-b", cfg.kafka.bootstrap_servers, "--json"]
    args += ["--inference-url", cfg.inference.base_url, "--metrics-interval", "1", *flags]
    environment = {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "20",
        **(env or {}),
    }
    with log_path.open("w") as log:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, env=environment)


def assert_complete(event: TrajectoryEvent, cfg: Config) -> None:
    """A whole episode as the learner needs it: steps in order, consistent end, tensors that match."""
    assert event.run == cfg.run and event.env_kind == "sim" and event.split == "train"
    assert event.started_at <= event.ended_at
    assert event.steps, "a published trajectory has at least one step"
    rewards = 0.0
    for i, step in enumerate(event.steps):
        ids, logprobs = step.token_ids.to_numpy(), step.token_logprobs.to_numpy()
        assert step.token_ids.dtype == "int32" and step.token_logprobs.dtype == "float32"
        assert ids.shape == logprobs.shape and ids.size >= 1
        assert all(math.isfinite(x) and x <= 1e-6 for x in logprobs.tolist())
        assert step.behaviour_logprob == pytest.approx(float(logprobs.sum()), abs=1e-3)
        assert step.action_text in step.candidates  # choice mode
        assert step.valid == (step.action != "") and (step.invalid_reason is None) == step.valid
        assert step.inference_latency_s > 0 and step.env_latency_s >= 0
        last = i == len(event.steps) - 1
        assert step.done == (last and event.termination in (Termination.SUCCESS, Termination.FAILURE))
        rewards += step.reward
    assert event.total_reward == pytest.approx(rewards)
    assert event.success == (event.termination is Termination.SUCCESS)
    if event.termination is Termination.SUCCESS:
        assert event.steps[-1].reward == 1.0
