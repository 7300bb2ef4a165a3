"""The `distrl-stream collect` process under faults: kill -9, SIGTERM, and its inference server going away."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distrl_stream.config import Config, InferenceConfig, ModelConfig
from distrl_stream.events import Termination, TrajectoryEvent, decode, utc_now
from distrl_stream.inference.server import InferenceServer
from tests.collector.conftest import ENDED, assert_complete, start_cli, trajectories, trajectory_watch

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]

# Sim steps of ~0.1 s on average (100x spread over tasks): several episodes are always mid-way.
LATENCY = {"DISTRL_ENV__LATENCY": "lognormal", "DISTRL_ENV__LATENCY_MEAN_S": "0.1"}


def _alive(proc: subprocess.Popen[str], log: Path) -> Callable[[], None]:
    def check() -> None:
        if proc.poll() is not None:
            pytest.fail(f"collector exited with {proc.returncode}:\n{log.read_text()[-3000:]}")

    return check


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_kill_9_mid_run_leaves_only_complete_trajectories(
    collector_config: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = collector_config()
    log = tmp_path / "collector.log"
    proc = start_cli(cfg, log, "--envs", "8", env=LATENCY)
    try:
        watch = trajectory_watch(cfg)
        watch.wait(6, 120, alive=_alive(proc, log))
        watch.close()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        _stop(proc)

    events = trajectories(cfg)
    assert len(events) >= 6 and len({e.episode_id for e in events}) == len(events)
    for event in events:
        assert event.termination in ENDED
        assert_complete(event, cfg)


def test_sigterm_exits_0_within_the_grace_period_with_finished_episodes_flushed(
    collector_config: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = collector_config()
    log = tmp_path / "collector.log"
    grace = 3.0
    proc = start_cli(cfg, log, "--envs", "8", "--grace", str(grace), env=LATENCY)
    try:
        watch = trajectory_watch(cfg)
        watch.wait(4, 120, alive=_alive(proc, log))
        watch.close()
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=grace + 20)
        took = time.monotonic() - signalled
    finally:
        _stop(proc)

    assert proc.returncode == 0, log.read_text()[-3000:]
    # Grace for the episodes, then a flush to a live broker and the process exit.
    assert took < grace + 10, f"exit took {took:.1f}s"
    report = json.loads(stdout)
    assert report["stop_reason"] == "SIGTERM" and report["undelivered"] == 0 and report["publish_failures"] == 0
    events = trajectories(cfg)
    ids = {e.episode_id for e in events}
    assert len(events) == len(ids) == report["published"] == report["delivered"] == report["episodes"] >= 4
    assert not ids & set(report["abandoned_ids"])  # abandoned episodes are never published
    assert "abandoned" in log.read_text() or not report["abandoned_ids"]
    for event in events:
        assert_complete(event, cfg)


@pytest.mark.slow
def test_inference_server_stopped_mid_run_ends_episodes_and_the_collector_recovers(
    collector_config: Callable[..., Config], tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A server of its own: the session's server must keep serving the other tests.
    # Start-up takes 30-60 s on 2 idle cores and minutes when other servers share them.
    inference = InferenceConfig(port=0, device="cpu", startup_timeout_s=480.0)
    server = InferenceServer(tiny_model_dir, inference, ModelConfig(), tmp_path / "vllm.log")
    server.start()
    restarted: InferenceServer | None = None
    cfg = collector_config(inference={"url": server.url})
    log = tmp_path / "collector.log"
    # Fail fast while the server is away: one attempt of 5 s, slots back off at most 2 s between episodes.
    faults = {
        "DISTRL_INFERENCE__RETRIES": "0",
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "5",
        "DISTRL_COLLECTOR__ERROR_BACKOFF_MAX_S": "2",
    }
    proc = start_cli(cfg, log, "--envs", "4", env={**LATENCY, **faults})
    watch = trajectory_watch(cfg)
    try:
        alive = _alive(proc, log)
        watch.wait(2, 120, alive=alive)
        server.stop()
        stopped_at = utc_now()

        def events() -> list[TrajectoryEvent]:
            return [decode(v, TrajectoryEvent) for v in watch.values]

        deadline = time.monotonic() + 60
        while not any(e.termination is Termination.INFERENCE_ERROR for e in events()):
            assert time.monotonic() < deadline, "no inference_error episode within 60 s of stopping the server"
            alive()
            watch.poll(0.5)
        alive()  # the collector outlived its server

        restarted = InferenceServer(
            tiny_model_dir, inference.model_copy(update={"port": server.port}), ModelConfig(), tmp_path / "vllm2.log"
        )
        restarted.start()
        # Every episode running while the server was away failed at its next request, so one that started after
        # the stop and ended normally ran entirely on the restarted server.
        deadline = time.monotonic() + 120
        while not any(e.termination in ENDED and e.started_at > stopped_at for e in events()):
            assert time.monotonic() < deadline, "no complete episode within 120 s of the server coming back"
            alive()
            watch.poll(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        watch.close()
        _stop(proc)
        server.stop()
        if restarted is not None:
            restarted.stop()

    assert proc.returncode == 0, log.read_text()[-3000:]
    report = json.loads(stdout)
    assert report["by_termination"]["inference_error"] >= 1
    errored = [e for e in events() if e.termination is Termination.INFERENCE_ERROR]
    for event in errored:
        # Published with the steps done before the server went away; the learner can tell them apart.
        assert_complete(event, cfg)
        assert not event.success and not event.steps[-1].done
    assert "ended by inference_error" in log.read_text()
