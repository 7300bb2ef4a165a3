"""End to end: a learner process + a collector process + the real vLLM server (tiny model, sim, choice mode).

One run proves the whole loop: trajectories flow in, weight versions flow out and are hot-loaded and served, the
learner survives kill -9 (resuming from its checkpoint with no gap and no duplicate in what it ingested), stops
cleanly on SIGTERM (final checkpoint, exit 0), and the policy it ends with solves clearly more held-out tasks than
the untrained one.

Settings: the CPU profile of docs/learner.md (critic warm-up, batch-centred advantages, policy lr 1e-3) on one
template, alarm_on ("Turn on the 7:30 alarm": open Clock, then tap the alarm the instruction names among several), so
held-out tasks ask for alarm times the learner never trained on. Random play succeeds about 5-10% of the time. From
scratch in 150 updates the tiny model learns one template, not several (docs/learner.md, part 3).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from distrl_stream.collector.evaluation import evaluate, held_out_tasks
from distrl_stream.config import Config
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import CheckpointStore, IngestLog, checkpoints_dir, learner_dir, read_json
from tests.fixtures.processes import CLI, ChildProcesses
from tests.fixtures.vllm import VllmService

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

TEMPLATES = '["alarm_on"]'
HELD_OUT = 40
TRAIN_UPDATES = 150  # total learner updates, across the kill and the restart
KILL_AT_VERSION = 3


def _env(cfg: Config, vllm: VllmService) -> dict[str, str]:
    return {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_ENV__TEMPLATES": TEMPLATES,
        "DISTRL_INFERENCE__URL": vllm.url,
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "20",
        "DISTRL_LEARNER__POLICY_LR": "0.001",
        "DISTRL_LEARNER__CRITIC_LR": "0.001",
        "DISTRL_LEARNER__ENTROPY_COEF": "0.0",
        "DISTRL_LEARNER__CRITIC_WARMUP_UPDATES": "20",
        "DISTRL_LEARNER__ADVANTAGE_CENTERING": "true",
        "DISTRL_LEARNER__BATCH_EPISODES": "8",
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "10",
        # A full priority refresh is a forward pass over the whole buffer: on two CPU cores, rarely and on less.
        "DISTRL_LEARNER__PRIORITY_REFRESH_INTERVAL": "100",
        "DISTRL_LEARNER__BUFFER_CAPACITY_STEPS": "2000",
        "DISTRL_LEARNER__CHECKPOINT_INTERVAL_UPDATES": "10",
        "DISTRL_LEARNER__METRICS_INTERVAL_S": "2",
        "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
        "DISTRL_COLLECTOR__METRICS_INTERVAL_S": "2",
    }


@pytest.fixture
def served_run(make_config: Callable[..., Config], vllm_server: VllmService) -> Iterator[tuple[Config, WeightWatcher]]:
    cfg = make_config(
        model={"base": vllm_server.model_dir},
        env={"templates": ["alarm_on"]},
        inference={"url": vllm_server.url, "request_timeout_s": 20.0},
    )
    ensure_run_topics(cfg)
    watcher = WeightWatcher(cfg, server_url=vllm_server.url)
    watcher.start()
    try:
        yield cfg, watcher
    finally:
        watcher.stop()
        vllm_server.unload_all_adapters()


def test_learner_collectors_and_vllm_learn_and_survive_kill_9(
    served_run: tuple[Config, WeightWatcher], vllm_server: VllmService, processes: ChildProcesses
) -> None:
    cfg, watcher = served_run
    tasks = held_out_tasks(cfg, HELD_OUT)
    untrained = asyncio.run(evaluate(cfg, tasks, concurrency=8, version=0))

    env = _env(cfg, vllm_server)
    learn = ["learn", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]
    learn += ["--model", str(cfg.model.base), "--threads", "1"]
    collect = ["collect", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers, "--envs", "8"]
    collect += ["--collector-id", "c0", "--pause-above-policy-lag", "2"]
    member = learner_dir(cfg.run_dir, "0")
    store = CheckpointStore(checkpoints_dir(cfg.run_dir))

    first = processes.start([CLI, *learn], env)
    processes.start([CLI, *collect], env)
    processes.wait_for(f"version {KILL_AT_VERSION}", lambda: watcher.newest_version >= KILL_AT_VERSION, 300)
    processes.kill(first)  # no final checkpoint
    killed_at = read_json(store.latest() / "state.json")  # type: ignore[operator]

    second = processes.start([CLI, *learn], env)

    def trained() -> bool:
        latest = store.latest()
        return latest is not None and read_json(latest / "state.json")["updates"] >= TRAIN_UPDATES

    processes.wait_for(f"{TRAIN_UPDATES} updates", trained, 600)
    second.send_signal(signal.SIGTERM)  # a clean stop: final checkpoint, exit 0
    assert second.wait(120) == 0, processes.tail()
    final = read_json(store.latest() / "state.json")  # type: ignore[operator]
    processes.wait_for(f"version {final['version']} served", lambda: watcher.newest_version == final["version"], 120)
    trained = asyncio.run(evaluate(cfg, tasks, concurrency=8, version=final["version"]))
    processes.stop_all()

    print(
        f"held-out success: untrained (v0) {untrained.success_rate:.2f} {untrained.by_template}, "
        f"trained (v{trained.version}, {final['updates']} updates) {trained.success_rate:.2f} {trained.by_template}"
    )
    assert trained.versions_seen == (final["version"],)
    assert trained.success_rate >= untrained.success_rate + 0.25, (untrained, trained)

    # Published and served: every version is on {run}.weights and the watcher loaded at least three of them.
    topics = TopicNames(cfg.run)
    published = [decode(m.value(), WeightVersionEvent).version for m in read_topic(cfg.kafka, topics.weights)]
    assert published == list(range(1, final["version"] + 1))
    metrics = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, topics.metrics)]
    loaded = {
        int(m.values["policy_version"]) for m in metrics if m.role == "inference" and m.labels["event"] == "loaded"
    }
    assert len(loaded) >= 3 and final["version"] in loaded
    learner_metrics = [m for m in metrics if m.role == "learner"]
    assert {"loss_policy", "rho_mean", "policy_lag_p95", "buffer_fill"} <= set().union(
        *(m.values for m in learner_metrics)
    )

    # kill -9 resumed from the checkpoint: updates went on from there, and the ingest log is exactly the topic.
    assert "resumed from ckpt-" in processes.log.read_text()
    assert final["updates"] >= TRAIN_UPDATES > killed_at["updates"]
    records = IngestLog.read(member / "ingested.log")
    for partition, end in final["offsets"].items():
        offsets = [r.offset for r in records if r.partition == int(partition)]
        assert offsets == list(range(end)), f"partition {partition}: gaps or duplicates"
    keys = Counter(r.episode_id for r in records)
    assert max(keys.values()) == 1
    on_topic = {
        decode(m.value(), TrajectoryEvent).episode_id
        for m in read_topic(cfg.kafka, topics.trajectories)
        if (str(m.partition()) in final["offsets"] and m.offset() < final["offsets"][str(m.partition())])
    }
    assert set(keys) == on_topic
