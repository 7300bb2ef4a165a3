"""Chaos soak: a whole run on a 3-node cluster while a seeded schedule SIGKILLs a role every 30-60 s, nothing lost.

The soak of tests/chaos.py (issue 32), as ``make test-cluster`` runs it: the real CLIs (a learner group of two under
torch's elastic agent, two collectors, two ``serve`` processes on the tiny model) on an :class:`EmbeddedCluster` of
three nodes, fifteen faults (three each of the learner agent, a learner member, a collector, a policy server and a
broker), each victim restarted as an operator's supervisor would, for at least ten minutes; then every role is stopped
cleanly and the run audited. ``metrics`` holds the faults by kind, the episodes on the topic, what each role reported
lost (``lost``: a killed collector's episodes in flight at the kill, anything a report says published but the topic
lacks, the learner's unannounced versions and lost metric events), what appeared twice (``doubled``: on the topic,
ingested, dead-lettered), and the schedule's ``seed``; ``schedule`` lists each fault as injected. ``passed`` is the
audit's verdict and ``violations`` what it found.

Usage: ``python bench/chaos.py [--quick] [--seed N]`` writes ``bench/results/chaos.json`` (``--quick``: one fault of
each kind, 10-20 s apart, no minimum length). The run's folder (every role's log) is kept when the audit fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from distrl_stream.cli.bench import write_results
from distrl_stream.config import load_config
from distrl_stream.kafka.broker import EmbeddedCluster
from distrl_stream.kafka.install import find_kafka_home
from distrl_stream.kafka.topics import ensure_run_topics
from distrl_stream.policy.model import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.chaos import KINDS, Soak, run_soak  # the soak the cluster test runs
from tests.fixtures.processes import ChildProcesses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one fault of each kind, 10-20 s apart (minutes)")
    parser.add_argument("--seed", type=int, default=32, help="the fault schedule's seed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    faults, gap_s, min_duration_s = (len(KINDS), (10.0, 20.0), 0.0) if args.quick else (15, (30.0, 60.0), 600.0)
    root = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    print(f"run folder {root}", flush=True)
    home = Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None
    cluster = EmbeddedCluster(root / "kafka", nodes=3, kafka_home=find_kafka_home(home))
    processes = ChildProcesses(root)
    result = None
    try:
        cfg = load_config(
            None,
            run="chaos",
            data_dir=root / "learner",
            kafka={"bootstrap_servers": cluster.start(), "replication_factor": 3},
            model={"base": build_model(root / "tiny", "tiny", seed=0)},
        )
        ensure_run_topics(cfg)
        soak = Soak(cfg, processes, root, servers=2, cluster=cluster)
        result = run_soak(soak, seed=args.seed, faults=faults, kinds=KINDS, gap_s=gap_s, min_duration_s=min_duration_s)
    finally:
        processes.stop_all()
        cluster.stop()
        if result is None or not result["passed"]:
            print(f"the soak failed: every role's log is in {root / 'processes.log'}", flush=True)
    result["quick"] = args.quick
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))
    if not result["passed"]:
        raise SystemExit(1)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
