"""Hosts that share nothing but the broker: a learner, two policy servers (`distrl-stream serve`) and two collectors,
each process with its own data dir, the weights carried by Kafka (``artifacts.store = "kafka"``, the default).

Every version the learner publishes is a ``kafka://`` artifact that both servers rebuild in their own data dirs,
verify and load; the collectors spread their requests over both servers, and every step records the server that
answered and the adapter sha256 that server listed, which must be the one the learner published for that version.
First the second server's vLLM engine is killed (as vLLM's own execute timeout kills it on saturated cores):
the same `serve` process restarts vLLM on the same port with a new weight watcher, which loads the learner's versions.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from distrl_stream.config import Config
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.inference.client import served_name
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.processes import descendants, free_port
from tests.fixtures.processes import CLI, ChildProcesses

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.timeout(1200)]


def _listed(url: str) -> set[str]:
    try:
        return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5.0).json()["data"]}
    except httpx.HTTPError:
        return set()


def _engine_core(serve_pid: int) -> int:
    """The pid of the vLLM engine process under a `serve` process (vLLM titles it ``VLLM::EngineCore``)."""
    for pid in descendants(serve_pid):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no vLLM engine process under serve (pid {serve_pid})")


def test_learner_two_servers_and_two_collectors_share_nothing_but_the_broker(
    make_config: Callable[..., Config], tiny_model_dir: Path, tmp_path: Path, processes: ChildProcesses
) -> None:
    cfg = make_config(model={"base": tiny_model_dir})
    assert cfg.artifacts.store == "kafka"
    ensure_run_topics(cfg)
    topics = TopicNames(cfg.run)
    env = {
        **os.environ,
        "DISTRL_MODEL__BASE": str(tiny_model_dir),
        "DISTRL_ENV__TEMPLATES": '["alarm_on"]',
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "60",
        "DISTRL_LEARNER__BATCH_EPISODES": "4",
        "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "4",
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "2",
        "DISTRL_LEARNER__PRIORITY_REFRESH_INTERVAL": "1000",
        "DISTRL_LEARNER__CHECKPOINT_INTERVAL_UPDATES": "10",
        "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
    }
    run = ["--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]

    def host(name: str) -> dict[str, str]:
        """The environment of a process on a host of its own: its data dir and nobody else's."""
        return {**env, "DISTRL_DATA_DIR": str(tmp_path / name)}

    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    servers = [
        processes.start([CLI, "serve", *run, "--port", str(port)], host(f"server{i}")) for i, port in enumerate(ports)
    ]
    base = served_name(cfg.model.policy_id, 0)
    processes.wait_for("both servers", lambda: all(base in _listed(url) for url in urls), 420)
    # Before the load starts: restarting vLLM on two cores that a learner, two collectors and the other server
    # saturate can outlast inference.startup_timeout_s (docs/inference.md).
    os.kill(_engine_core(servers[1].pid), signal.SIGKILL)
    restarting = f"restarting it (1 of {cfg.inference.restarts})"
    processes.wait_for("serve restarting the second vLLM", lambda: restarting in processes.text(), 60)
    processes.wait_for("the second server restarted", lambda: base in _listed(urls[1]), 420)
    learner = processes.start([CLI, "learn", *run, "--threads", "1"], host("learner"))
    collectors = {
        c: processes.start(
            [CLI, "collect", *run, "--envs", "4", "--collector-id", c, "--json"]
            + [flag for url in urls for flag in ("--inference-url", url)],
            host(c),
            report=c,
        )
        for c in ("c0", "c1")
    }

    def acted_by(values: list[TrajectoryEvent]) -> dict[str, set[int]]:
        used: dict[str, set[int]] = defaultdict(set)
        for event in values:
            for step in event.steps:
                used[step.server].add(step.policy_version)
        return used

    def trajectories() -> list[TrajectoryEvent]:
        return [decode(m.value(), TrajectoryEvent) for m in read_topic(cfg.kafka, topics.trajectories, timeout_s=30)]

    def both_servers_answered_with_version_3() -> bool:
        used = acted_by(trajectories())
        return all(max(used.get(url, {0})) >= 3 for url in urls)

    processes.wait_for("steps of version 3 or later from both servers", both_servers_answered_with_version_3, 480)
    for c, proc in collectors.items():
        assert processes.stop(proc) == 0, f"{c}:\n{processes.tail()}"
    assert processes.stop(learner, 180) == 0, processes.tail()

    published = {
        e.version: e for e in (decode(m.value(), WeightVersionEvent) for m in read_topic(cfg.kafka, topics.weights))
    }
    assert len(published) >= 3 and sorted(published) == list(range(1, max(published) + 1))
    assert all(e.adapter_uri.startswith("kafka://") and e.base_fingerprint for e in published.values())

    def loaded_by_server() -> dict[str, set[int]]:
        loaded: dict[str, set[int]] = defaultdict(set)
        for m in read_topic(cfg.kafka, topics.metrics, timeout_s=30):
            metric = decode(m.value(), MetricEvent)
            if metric.role == "inference" and metric.labels.get("event") == "loaded":
                loaded[metric.source_id].add(int(metric.values["policy_version"]))
        return loaded

    # A server loads the newest version it has read: one published while it was still loading can be skipped.
    deadline = time.monotonic() + 180
    while len(loaded := loaded_by_server()) < 2 or any(
        max(published) not in v or not v <= set(published) for v in loaded.values()
    ):
        assert time.monotonic() < deadline, f"the newest version not loaded by both servers: {dict(loaded)}"
        time.sleep(1.0)
    assert {source.rsplit(":", 1)[-1] for source in loaded} == {str(port) for port in ports}
    assert processes.text().count("restarting it (") == 1, processes.tail()  # that restart and no other
    assert servers[1].poll() is None, "the second server's serve process did not survive its vLLM's death"
    newest = served_name(cfg.model.policy_id, max(published))
    for i in range(2):  # rebuilt from Kafka in each server's own data dir, under its sha256
        staged = {p.name for p in (tmp_path / f"server{i}").rglob(f"{newest}-*")}
        assert staged == {f"{newest}-{published[max(published)].sha256}"}, staged
    assert not (tmp_path / "server0" / "runs" / cfg.run / "artifacts").exists()  # no learner-side store there

    events = trajectories()
    steps = [s for e in events for s in e.steps if s.policy_version > 0]
    assert {s.server for s in steps} == set(urls)
    for step in steps:
        assert step.adapter_sha256 == published[step.policy_version].sha256, (step.server, step.policy_version)
    # A server that stops leaves none of its staged copies behind (its vLLM can no longer reload them).
    assert processes.stop(servers[0], 120) == 0, processes.tail()
    serving = tmp_path / "server0" / "runs" / cfg.run / "serving"
    assert not [p for p in serving.rglob("*") if p.is_file()], sorted(serving.rglob("*"))
    reports = {c: processes.report(c) for c in collectors}
    assert all(
        r["delivered"] == r["episodes"] and r["by_termination"].get("inference_error", 0) == 0 for r in reports.values()
    )
    print(
        f"{len(published)} versions over kafka://, loaded by both servers; {len(events)} episodes, "
        f"{len(steps)} steps acted with a trained version, by server: "
        f"{ {url: sum(s.server == url for s in steps) for url in urls} }"
    )
