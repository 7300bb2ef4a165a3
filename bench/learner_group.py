"""Learner group scaling: episodes trained per second by 1 member vs 2 members (torch.distributed, gloo on the CPU).

Headline (issue 12): ``ratio`` = (updates/s × members) of a 2-member group ÷ updates/s of a single learner, both
with the same batch per member, one torch thread per member, on the same topic contents; the ideal is 2.0, the target
1.7. Each phase is the real CLI (``distrl-stream learn --nproc-per-node N``, under torch's elastic agent for N = 2) on
an embedded broker, fed beforehand with simulated-phone episodes, so no inference server runs. Rates come from the
members' own metric events (rank 0), between the first and the last event with updates > 0.

Also measured (``metrics``): the parameter-hash check (every member's final sha256 of its LoRA + critic parameters
must be equal), and the **rebalance pause**: a 2-member group is kill -9'd in one member; the pause runs from the
kill until rank 0 reports an update beyond the checkpoint it resumed from (target ≤ 30 s on CPU). The load average of
the machine at start and end is recorded, since other processes on shared cores depress the ratio.

Usage: ``python bench/learner_group.py [--quick] [--model DIR]`` writes ``bench/results/learner_group.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from distrl_stream.cli.bench import write_results
from distrl_stream.config import Config, load_config
from distrl_stream.events import MetricEvent, decode, encode
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.install import find_kafka_home
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import CheckpointStore, checkpoints_dir, read_json
from distrl_stream.policy.model import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.learner.simdata import sim_events  # the test suite's episode generator

TARGET_RATIO = 1.7
CLI = str(Path(sys.executable).with_name("distrl-stream"))
BATCH = 8
PARTITIONS = 4


def env_for(cfg: Config) -> dict[str, str]:
    settings = {
        "BATCH_EPISODES": str(BATCH),
        "MIN_BUFFER_EPISODES": str(BATCH),
        "UPDATES_PER_VERSION": "10",
        "CHECKPOINT_INTERVAL_UPDATES": "10",
        "PRIORITY_REFRESH_INTERVAL": "100000",
        "METRICS_INTERVAL_S": "0.5",
        "THREADS": "1",
    }
    return {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_MODEL__BASE": str(cfg.model.base),
        **{f"DISTRL_LEARNER__{k}": v for k, v in settings.items()},
    }


def learn(cfg: Config, members: int, *extra: str) -> list[str]:
    args = [CLI, "learn", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]
    return [*args, "--nproc-per-node", str(members), *extra]


def feed(cfg: Config, events: list[Any]) -> None:
    with Producer(cfg.kafka, client_id="bench-feed") as producer:
        for event in events:
            producer.produce(TopicNames(cfg.run).trajectories, encode(event), key=event.episode_id.encode())
        producer.flush()


def rank0_metrics(cfg: Config) -> list[MetricEvent]:
    events = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    return [e for e in events if e.role == "learner" and e.labels.get("rank") == "0"]


def update_rate(cfg: Config) -> float:
    """Updates per second of rank 0 between its first and last metric event with updates > 0."""
    points = [(e.timestamp.timestamp(), e.values["updates"]) for e in rank0_metrics(cfg) if e.values["updates"] > 0]
    (t0, u0), (t1, u1) = points[0], points[-1]
    return (u1 - u0) / max(t1 - t0, 1e-9)


def wait_for_split(log: Path, since: int, members: int, agent: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until every member's last logged assignment holds PARTITIONS / members partitions (data fed before that
    would all go to whichever member joined Kafka first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")[since:]
        last = dict(re.findall(r"learner (\d+) assigned (\[[^\]]*\])", text))
        if len(last) == members and all(v.count("(") == PARTITIONS // members for v in last.values()):
            return
        if time.monotonic() > deadline or agent.poll() is not None:
            raise SystemExit(f"the {members}-member group never split the partitions; see {log}")
        time.sleep(0.5)


def start(cfg: Config, members: int, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    since = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        agent = subprocess.Popen(
            learn(cfg, members, *extra), env=env_for(cfg), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return agent, since


def throughput(root: Path, base: Config, events: list[Any], members: int, updates: int, log: Path) -> dict[str, Any]:
    cfg = load_config(None, run=f"scale{members}", data_dir=root / f"m{members}", **_common(base))
    ensure_run_topics(cfg)
    agent, since = start(cfg, members, log, "--max-updates", str(updates))
    wait_for_split(log, since, members, agent, 600.0)
    feed(cfg, events)
    if agent.wait(1200) != 0:
        raise SystemExit(f"{members}-member run failed ({agent.returncode}); see {log}")
    text = re.sub(r"\s+", " ", log.read_text(errors="replace")[since:])
    hashes = re.findall(r"parameters sha256 ([0-9a-f]{64})", text)
    return {"updates_per_s": update_rate(cfg), "hashes": hashes}


def rebalance_pause(root: Path, base: Config, events: list[Any], log: Path, timeout_s: float) -> float:
    cfg = load_config(None, run="pause", data_dir=root / "pause", **_common(base))
    ensure_run_topics(cfg)
    store = CheckpointStore(checkpoints_dir(cfg.run_dir))
    agent, since = start(cfg, 2, log, "--max-restarts", "2")
    try:
        wait_for_split(log, since, 2, agent, timeout_s)
        feed(cfg, events)
        deadline = time.monotonic() + timeout_s
        while store.latest() is None or read_json(store.latest() / "state.json")["updates"] < 20:  # type: ignore[operator]
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit(f"the 2-member group never reached 20 updates; see {log}")
            time.sleep(0.5)
        resumed_from = read_json(store.latest() / "state.json")["updates"]  # type: ignore[operator]
        pid = int((cfg.run_dir / "learner" / "1" / ".lock").read_text())
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        while True:
            later = [e for e in rank0_metrics(cfg) if e.timestamp.timestamp() > killed]
            updated = [e.timestamp.timestamp() for e in later if e.values["updates"] > resumed_from]
            if updated:
                return min(updated) - killed
            if time.monotonic() > deadline + 300:
                raise SystemExit(f"the group did not update again after the kill; see {log}")
            time.sleep(0.5)
    finally:
        # SIGTERM first: the agent stops its members (they run in sessions of their own, out of reach of killpg).
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def _common(base: Config) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": base.kafka.bootstrap_servers, "trajectory_partitions": PARTITIONS},
        "model": {"base": base.model.base},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates per phase (a few minutes)")
    parser.add_argument("--model", type=Path, help="train this base model folder instead of building the tiny one")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    updates = 40 if args.quick else 200
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-learner-group-") as tmp:
        root = Path(tmp)
        model_dir = args.model or build_model(root / "tiny", "tiny", seed=0)
        home = Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None
        broker = EmbeddedBroker(root / "kafka", kafka_home=find_kafka_home(home), heap_mb=1024)
        bootstrap = broker.start()
        try:
            base = load_config(None, kafka={"bootstrap_servers": bootstrap}, model={"base": model_dir})
            events = sim_events(AutoTokenizer.from_pretrained(model_dir), 64, seed=0)
            log = root / "learners.log"
            one = throughput(root, base, events, 1, updates, log)
            two = throughput(root, base, events, 2, updates, log)
            pause = rebalance_pause(root, base, events, log, 600.0)
        finally:
            broker.stop()
    ratio = two["updates_per_s"] * 2 / one["updates_per_s"]
    metrics = {
        "single_updates_per_s": one["updates_per_s"],
        "group2_updates_per_s": two["updates_per_s"],
        "group2_episodes_per_s": two["updates_per_s"] * 2 * BATCH,
        "single_episodes_per_s": one["updates_per_s"] * BATCH,
        "batch_episodes_per_member": BATCH,
        "updates_per_phase": updates,
        "torch_threads_per_member": 1,
        "parameter_hashes_equal": len(two["hashes"]) == 2 and len(set(two["hashes"])) == 1,
        "parameter_hashes": two["hashes"],
        "rebalance_pause_s": pause,
        "rebalance_pause_target_s": 30.0,
        "model": str(args.model) if args.model else "tiny",
        "cpu_count": os.cpu_count(),
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
    }
    result = {"name": "learner_group", "quick": args.quick, "ratio": ratio, "target": TARGET_RATIO, "metrics": metrics}
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
