"""Collection throughput: asynchronous (DistRL) vs synchronous rounds (DigiRL multi-machine), the paper's 2.4x.

Headline (issue 6): ``ratio`` = async ÷ sync trajectories per minute, target ≥ 3 (the paper reports 2.4x: 7.7 vs 3.2
trajectories/min at 32 emulators). Both modes run the same code (``distrl_stream.collector``) with K = 32 simulated
phones whose step latency is heavy-tailed (log-normal around a per-task scale spanning 100x, as DistRL reports for
Android), against the same vLLM server (tiny local model, choice mode), for the same duration, one after the other in
the same benchmark run, drawing the same task sequence (same collector id and seed).

- async: each env loops on its own; an episode starts the moment the previous one ends.
- sync: rounds of one episode per env on one version; the round ends when its slowest episode ends (barrier); then
  the collector waits until the server serves the next version. That version comes from an *instant learner*
  (``InstantLearner``): it publishes version v+1 on ``{run}.weights`` the moment the round's 32 trajectories are on
  the topic, and the real weight watcher verifies and hot-loads it (a real LoRA adapter). Zero training time is the
  most favourable learner sync mode can have; a real learner only makes sync slower.

Counted: trajectories that ended within the measured duration (episodes still running at the end are abandoned in
both modes). ``metrics.ideal_per_min`` = 32 × 60 / mean episode time, the mean over the async run's episodes. That
mean includes the inference service's latency at this load, so the efficiency measures how fully the collector keeps
its K envs busy; it is conservative (the episodes cut off at the end are the long ones, so the mean of those that
ended is short, and the cut-off work itself is lost). ``metrics.efficiency`` = async ÷ ideal, target ≥ 0.9.
``metrics.ratio_completed_rounds`` is a reading kinder to sync: its trajectories over the time up to the end of its
last completed round (no cut-off round).

Usage: ``python bench/collection.py [--quick] [--envs 32] [--duration S] [--latency-mean S]`` writes
``bench/results/collection.json`` and ``bench/results/collection.png`` (trajectories over time, both modes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distrl_stream.cli.bench import results_file, write_results
from distrl_stream.collector import Collector
from distrl_stream.config import Config, InferenceConfig, ModelConfig, load_config
from distrl_stream.events import TrajectoryEvent, decode
from distrl_stream.inference.server import InferenceServer
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.policy.model import build_model
from distrl_stream.testing.instant_learner import InstantLearner, write_noop_adapter

TARGET_RATIO = 3.0
TARGET_EFFICIENCY = 0.9

log = logging.getLogger("bench.collection")


def run_mode(cfg: Config) -> tuple[list[TrajectoryEvent], float]:
    """Run one collector to its duration; returns its trajectories and when its first episode began (epoch s)."""
    report = asyncio.run(Collector(cfg).run())
    log.info("%s", report.summary())
    events = [decode(m.value(), TrajectoryEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories)]
    return events, min(e.started_at.timestamp() for e in events)


def rate(events: list[TrajectoryEvent], began: float, duration_s: float) -> tuple[float, list[float]]:
    """Trajectories per minute that ended within ``duration_s`` of ``began``; and their end offsets, sorted."""
    ends = sorted(e.ended_at.timestamp() - began for e in events)
    ends = [t for t in ends if t <= duration_s]
    return len(ends) * 60.0 / duration_s, ends


def plot(curves: dict[str, list[float]], ideal_per_min: float, duration_s: float, path: Path) -> None:
    """Cumulative trajectories over time for each mode, with the ideal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, ends in curves.items():
        ax.step([0.0, *ends], range(len(ends) + 1), where="post", label=label)
    ax.plot([0, duration_s], [0, ideal_per_min * duration_s / 60.0], "k--", lw=1, label="ideal (K / mean episode)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("trajectories published")
    ax.set_title("Collection: asynchronous vs synchronous rounds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # results/quick/ on a first quick run
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 s per mode instead of 240 s (about 4 min in all)")
    parser.add_argument("--envs", type=int, default=32, help="K: environments per collector")
    parser.add_argument("--duration", type=float, help="seconds per mode (default 60 quick, 240 full)")
    parser.add_argument("--latency-mean", type=float, default=0.8, help="mean sim step latency in seconds")
    args = parser.parse_args()
    duration = args.duration or (60.0 if args.quick else 240.0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench-collection-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "tiny", "tiny", seed=0)
        broker = EmbeddedBroker.from_config(load_config(None, data_dir=root / "data"))
        bootstrap = broker.start()
        server = InferenceServer(
            model_dir, InferenceConfig(port=0, startup_timeout_s=300.0), ModelConfig(), root / "vllm.log"
        )
        startup = time.monotonic()
        server.start()
        startup_s = time.monotonic() - startup
        try:
            adapter = write_noop_adapter(model_dir, root / "adapter", ModelConfig())

            def config(mode: str) -> Config:
                return load_config(
                    None,
                    run=f"bench-collection-{mode}",
                    data_dir=root / "data",
                    kafka={"bootstrap_servers": bootstrap},
                    inference={"url": server.url},
                    env={"latency": "lognormal", "latency_mean_s": args.latency_mean},
                    collector={
                        "envs": args.envs,
                        "mode": mode,
                        "collector_id": "bench",
                        "duration_s": duration,
                        "shutdown_grace_s": 0.0,
                        "metrics_interval_s": 5.0,
                        "version_refresh_s": 0.1,
                    },
                )

            log.info("async: %d envs for %.0fs", args.envs, duration)
            async_events, async_began = run_mode(config("async"))

            sync_cfg = config("sync")
            watcher = WeightWatcher(sync_cfg, server_url=server.url)
            watcher.start()
            learner = InstantLearner(sync_cfg, adapter, round_episodes=args.envs)
            learner.start()
            try:
                log.info("sync: %d envs for %.0fs", args.envs, duration)
                sync_events, sync_began = run_mode(sync_cfg)
            finally:
                learner.stop()
                watcher.stop()
            if learner.failed is not None or watcher.failed is not None or watcher.refused:
                sys.exit(f"version pipeline failed: {learner.failed or watcher.failed or watcher.refused}")
        finally:
            server.stop()
            broker.stop()

    async_per_min, async_ends = rate(async_events, async_began, duration)
    sync_per_min, sync_ends = rate(sync_events, sync_began, duration)
    episode_s = [(e.ended_at - e.started_at).total_seconds() for e in async_events]
    mean_episode_s = statistics.mean(episode_s)
    # Episodes that ended inside the window are biased short (the long ones are those cut off at the end); those
    # that started in its first half are not, but the load of these shared cores drifts between the halves.
    early = [
        d
        for d, e in zip(episode_s, async_events, strict=True)
        if e.started_at.timestamp() - async_began <= duration / 2
    ]
    ideal_per_min = args.envs * 60.0 / mean_episode_s
    steps = [len(e.steps) for e in async_events]
    env_s = [sum(s.env_latency_s for s in e.steps) for e in async_events]
    inference_s = [sum(s.inference_latency_s for s in e.steps) for e in async_events]

    # Rounds of the sync run: its episodes grouped by version (one version per round, by construction).
    rounds: dict[int, list[TrajectoryEvent]] = {}
    for event in sync_events:
        if event.steps:  # an attempt that failed before its first step is published, but acted by no version
            rounds.setdefault(event.steps[0].policy_version, []).append(event)
    complete = [r for r in rounds.values() if len(r) == args.envs]
    round_ends = sorted(max(e.ended_at.timestamp() for e in r) - sync_began for r in complete)
    round_starts = sorted(min(e.started_at.timestamp() for e in r) - sync_began for r in complete)
    round_s = [end - start for start, end in zip(round_starts, round_ends, strict=True)]
    waits = [b - a for a, b in zip(round_ends, round_starts[1:], strict=False)]
    sync_rounds_per_min = len(complete) * args.envs * 60.0 / round_ends[-1] if round_ends else 0.0
    mixed = sum(len({s.policy_version for e in r for s in e.steps}) > 1 for r in rounds.values())

    ratio = async_per_min / sync_per_min if sync_per_min else float("inf")
    plot(
        {"async (DistRL)": async_ends, "sync rounds (DigiRL)": sync_ends},
        ideal_per_min,
        duration,
        results_file(__file__, quick=args.quick).with_suffix(".png"),
    )
    result: dict[str, Any] = {
        "name": "collection",
        "quick": args.quick,
        "ratio": ratio,
        "target": TARGET_RATIO,
        "metrics": {
            "async_trajectories_per_min": async_per_min,
            "sync_trajectories_per_min": sync_per_min,
            "ideal_per_min": ideal_per_min,
            "efficiency": async_per_min / ideal_per_min,
            "efficiency_target": TARGET_EFFICIENCY,
            "sync_efficiency": sync_per_min / ideal_per_min,
            "ratio_completed_rounds": async_per_min / sync_rounds_per_min if sync_rounds_per_min else None,
            "async_trajectories": len(async_ends),
            "sync_trajectories": len(sync_ends),
            "mean_episode_s": mean_episode_s,
            "mean_episode_s_started_first_half": statistics.mean(early),
            "p95_episode_s": statistics.quantiles(episode_s, n=20)[-1] if len(episode_s) > 1 else mean_episode_s,
            "max_episode_s": max(episode_s),
            "mean_episode_steps": statistics.mean(steps),
            "mean_episode_env_s": statistics.mean(env_s),
            "mean_episode_inference_s": statistics.mean(inference_s),
            "sync_rounds_completed": len(complete),
            "sync_round_s_mean": statistics.mean(round_s) if round_s else None,
            "sync_version_wait_s_mean": statistics.mean(waits) if waits else None,
            "sync_rounds_mixing_versions": mixed,
            "envs": args.envs,
            "duration_s_per_mode": duration,
            "latency_mean_s": args.latency_mean,
            "latency_task_spread": 100.0,
            "vllm_startup_s": startup_s,
            "load_average_1min": os.getloadavg()[0],
            "notes": "sync gets its next version from an instant learner (publishes v+1 as soon as the round's "
            "trajectories are in; the real watcher hot-loads it): the most favourable case for sync. ideal = K / "
            "mean episode time of the async episodes (inference latency at this load included). Episodes running "
            "at the end of the window are abandoned in both modes.",
        },
    }
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
