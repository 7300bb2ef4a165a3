"""End to end: `distrl-stream up --duration 60 --collectors 2` on the tiny model and the simulated phone.

One real run (embedded broker, vLLM, learner, two collectors) is shared by the module: it must exit 0 having
collected trajectories and served at least two weight versions, leave no process behind, and leave data that
`monitor --once`, `replay export` and `replay report` read back (after `kafka start`-ing its broker again). While it
runs, every role's Prometheus endpoint (`--metrics-port 0`) is scraped until its numbers moved.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from prometheus_client.samples import Sample
from typer.testing import CliRunner

from distrl_stream.analysis.replay import read_weight_versions
from distrl_stream.cli.main import app
from distrl_stream.config import KafkaConfig
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.processes import free_port
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.vllm]
RUN = "e2e"
runner = CliRunner()


@dataclass(frozen=True)
class UpRun:
    """What the shared run left: its exit, output, summary, leftover processes, and its broker started again."""

    returncode: int
    stdout: str
    stderr: str
    summary: dict
    leftovers: list[str]
    data_dir: Path
    bootstrap: str
    scraped: dict[str, list[Sample]]


def _marked_processes(marker: str) -> list[str]:
    """Processes whose environment carries ``marker`` (every descendant of `up` inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:200]
                found.append(f"{entry.name}: {command!r}")
        except OSError:
            continue  # exited, or not ours to read
    return found


def _scrape_while_running(up: subprocess.Popen[bytes], targets_file: Path) -> dict[str, list[Sample]]:
    """Scrape every endpoint `up` lists until each role's numbers moved (or `up` ended): process -> last samples."""
    wanted = {
        "up": ("distrl_up_uptime_seconds", 0),
        "serve": ("distrl_inference_served_version", 1),
        "learner": ("distrl_learner_updates_total", 1),
    }

    def moved(name: str, samples: list[Sample]) -> bool:
        metric, least = wanted.get(name, ("distrl_collector_trajectories_delivered_total", 1))
        return (value(samples, metric) or -1) >= least

    scraped: dict[str, list[Sample]] = {}
    while up.poll() is None:
        targets = json.loads(targets_file.read_text()) if targets_file.is_file() else []
        for target in targets:
            name = target["labels"]["process"]
            if name not in scraped or not moved(name, scraped[name]):
                with contextlib.suppress(httpx.HTTPError):  # a child still starting
                    scraped[name] = scrape(target["targets"][0])
        if targets and len(scraped) == len(targets) and all(moved(n, s) for n, s in scraped.items()):
            break
        time.sleep(1.0)
    return scraped


@pytest.fixture(scope="module")
def up_run(tmp_path_factory: pytest.TempPathFactory, kafka_home: Path) -> Iterator[UpRun]:
    data_dir = tmp_path_factory.mktemp("up") / "distrl-data"
    marker = f"distrl-up-test-{uuid.uuid4().hex}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DISTRL_")},
        "KAFKA_HOME": str(kafka_home),
        "DISTRL_TEST_MARKER": marker,
        # A free port instead of 9092: other brokers may run on this machine.
        "DISTRL_BROKER__PORT": str(free_port()),
        # Versions every 2 updates (default 20) and one torch thread: on a shared 2-core machine an update of even
        # the tiny model can take seconds, and the test needs two versions served within the 60 s.
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "2",
        "DISTRL_LEARNER__THREADS": "1",
    }
    out, err = data_dir.parent / "up.out", data_dir.parent / "up.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        up = subprocess.Popen(
            [
                *(sys.executable, "-m", "distrl_stream.cli", "up", "--duration", "60", "--collectors", "2"),
                # Two environments per collector keep the CPU for the learner and the server (the sim is fast).
                *("--envs-per-collector", "2"),
                *("--no-monitor", "--run", RUN, "--data-dir", str(data_dir), "--metrics-port", "0"),
                # vLLM on CPU starts in 30-60 s, but several minutes when other test runs share the cores.
                *("--startup-timeout", "900"),
            ],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            scraped = _scrape_while_running(up, data_dir / "runs" / RUN / "prometheus-targets.json")
            up.wait(timeout=1800)
        finally:
            if up.poll() is None:
                up.kill()
    # Children are reaped before `up` returns; give the kernel a moment to drop exited entries from /proc.
    deadline = time.monotonic() + 10
    leftovers = _marked_processes(marker)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = _marked_processes(marker)
    summary_file = data_dir / "runs" / RUN / "up-summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    broker = EmbeddedBroker(data_dir / "kafka", kafka_home=kafka_home)
    bootstrap = broker.start()  # as `distrl-stream kafka start` would, from the same data folder
    try:
        yield UpRun(up.returncode, out.read_text(), err.read_text(), summary, leftovers, data_dir, bootstrap, scraped)
    finally:
        broker.stop()


def test_up_runs_exits_0_and_reports_trajectories_and_served_versions(up_run: UpRun) -> None:
    assert up_run.returncode == 0, f"{up_run.stdout}\n{up_run.stderr[-4000:]}"
    assert up_run.summary["episodes"] > 0
    assert len(up_run.summary["versions_served"]) >= 2, up_run.summary
    episodes = int(re.search(r"trajectories: (\d+)", up_run.stdout).group(1))
    served = int(re.search(r"(\d+) served", up_run.stdout).group(1))
    assert episodes == up_run.summary["episodes"] and served >= 2
    # Held-out success of the untrained policy before the learner started, and of a trained version at the end.
    start, end = up_run.summary["held_out_start"], up_run.summary["held_out_end"]
    assert start["version"] == 0 and end["version"] in up_run.summary["versions_served"], up_run.summary
    assert start["tasks"] == end["tasks"] == 40 and "held-out success: " in up_run.stdout
    # Pacing: the share of their time the collectors held episodes back and the learner waited for data.
    paused, idle = up_run.summary["collectors_paused_share"], up_run.summary["learner_idle_share"]
    assert 0 <= paused <= 1 and 0 <= idle <= 1, up_run.summary
    assert f"collectors paused {100 * paused:.0f}% of their time" in up_run.stdout
    # Every step was trained on the server's prompt ids, which the learner's own rendering reproduces.
    assert up_run.summary["prompt_ids_checked"] > 0 and up_run.summary["prompt_ids_mismatched"] == 0, up_run.summary


def test_every_role_serves_prometheus_metrics_whose_numbers_move(up_run: UpRun) -> None:
    scraped = up_run.scraped
    assert set(scraped) == {"up", "serve", "learner", "collector-0", "collector-1"}, up_run.stdout
    assert "Prometheus scrape targets" in up_run.stdout
    for name in ("serve", "learner", "collector-0", "collector-1"):
        assert value(scraped["up"], "distrl_up_process_running", process=name, run=RUN) == 1
    assert value(scraped["serve"], "distrl_inference_served_version", role="inference") >= 1
    assert value(scraped["learner"], "distrl_learner_updates_total", source="0") >= 1
    assert value(scraped["learner"], "distrl_learner_trajectories_total", status="ingested") >= 1
    for name in ("collector-0", "collector-1"):
        assert value(scraped[name], "distrl_collector_trajectories_delivered_total", source=name) >= 1
        assert value(scraped[name], "distrl_collector_inference_latency_seconds_count") >= 1


def test_no_child_process_outlives_up(up_run: UpRun) -> None:
    assert up_run.leftovers == []


def test_monitor_once_shows_the_run_s_throughput(up_run: UpRun) -> None:
    result = runner.invoke(app, ["monitor", "--once", "--run", RUN, "-b", up_run.bootstrap])
    assert result.exit_code == 0, result.output
    per_min = [float(x) for x in re.findall(r"throughput \([^)]*\): ([\d.]+) trajectories/min", result.output)]
    assert per_min and max(per_min) > 0, result.output
    assert "collector-0" in result.output and "collector-1" in result.output


def test_replay_export_has_one_row_per_trajectory_in_the_topic(up_run: UpRun, tmp_path: Path) -> None:
    in_topic = sum(1 for _ in read_topic(KafkaConfig(bootstrap_servers=up_run.bootstrap), TopicNames(RUN).trajectories))
    out = tmp_path / "episodes.parquet"
    result = runner.invoke(app, ["replay", "export", str(out), "--run", RUN, "-b", up_run.bootstrap])
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).num_rows == in_topic == up_run.summary["episodes"]


def test_replay_report_writes_the_plots(up_run: UpRun, tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", "report", str(tmp_path / "report"), "--run", RUN, "-b", up_run.bootstrap])
    assert result.exit_code == 0, result.output
    for name in ("success_over_time", "trajectories_over_time", "lag_histogram", "length_by_task"):
        assert (tmp_path / "report" / f"{name}.png").stat().st_size > 1000
    assert "| episodes |" in (tmp_path / "report" / "summary.md").read_text()


def test_replay_learn_warm_starts_a_new_run_from_the_recorded_one(up_run: UpRun) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DISTRL_")},
        "DISTRL_DATA_DIR": str(up_run.data_dir),  # the base model `up` built is found there
        "DISTRL_LEARNER__THREADS": "1",
    }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "distrl_stream.cli", "replay", "learn", RUN, "--run", f"{RUN}-warm"),
            *("-b", up_run.bootstrap, "--replay-updates", "2", "--max-updates", "2"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # The offline phase's result is published as the new run's first version, before any online data exists.
    versions = read_weight_versions(KafkaConfig(bootstrap_servers=up_run.bootstrap), f"{RUN}-warm")
    assert [v.version for v in versions] == [1]
    assert f"from {RUN}.trajectories" in done.stderr


def test_sigterm_to_up_while_it_starts_stops_everything(tmp_path: Path, kafka_home: Path) -> None:
    marker = f"distrl-up-test-{uuid.uuid4().hex}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DISTRL_")},
        "KAFKA_HOME": str(kafka_home),
        "DISTRL_TEST_MARKER": marker,
        "DISTRL_BROKER__PORT": str(free_port()),
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "distrl_stream.cli", "up", "--no-monitor", "--run", "sig", "--data-dir", str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server_log = tmp_path / "runs" / "sig" / "logs" / "serve.log"
    try:
        deadline = time.monotonic() + 300
        while not server_log.exists() and up.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server_log.exists(), "the policy server never started"
        up.terminate()  # SIGTERM while vLLM is still starting
        output, _ = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, output
    assert "run sig stopped" in output
    deadline = time.monotonic() + 10
    while _marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked_processes(marker) == []


def test_served_versions_print_as_ranges() -> None:
    from distrl_stream.cli.up import version_ranges

    assert version_ranges(range(1, 45)) == "v1-v44"
    assert version_ranges([5, 1, 2, 3, 7, 8]) == "v1-v3, v5, v7-v8"
    assert version_ranges([]) == "none"
