"""`distrl-stream learn`: the learner role: consume trajectories, train (A-RIDE or a baseline), publish versions."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from distrl_stream.cli.common import (
    BootstrapOption,
    ConfigOption,
    RunOption,
    build_config,
    err_console,
    field_option,
    run_command,
)
from distrl_stream.config import ALGORITHMS

# Update rules of the offline phase (``--from-replay``): every algorithm, as choices Typer can offer.
ReplayAlgorithm = StrEnum("ReplayAlgorithm", {name.upper(): name for name in ALGORITHMS})


def learn(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    algorithm: Annotated[str | None, field_option("learner.algorithm", "--algorithm")] = None,
    model: Annotated[Path | None, field_option("model.base", "--model")] = None,
    init_adapter: Annotated[Path | None, field_option("learner.init_adapter", "--init-adapter")] = None,
    member: Annotated[str | None, field_option("learner.member_id", "--member")] = None,
    round_episodes: Annotated[int | None, field_option("learner.round_episodes", "--round-episodes")] = None,
    drop_above_policy_lag: Annotated[
        int | None, field_option("learner.drop_above_policy_lag", "--drop-above-policy-lag")
    ] = None,
    updates_per_version: Annotated[
        int | None, field_option("learner.updates_per_version", "--updates-per-version")
    ] = None,
    max_updates: Annotated[int | None, field_option("learner.max_updates", "--max-updates")] = None,
    checkpoint_interval: Annotated[
        int | None, field_option("learner.checkpoint_interval_updates", "--checkpoint-interval")
    ] = None,
    threads: Annotated[int | None, field_option("learner.threads", "--threads")] = None,
    metrics_port: Annotated[int | None, field_option("learner.metrics_port", "--metrics-port", min=0)] = None,
    tensorboard_dir: Annotated[Path | None, field_option("learner.tensorboard_dir", "--tensorboard-dir")] = None,
    from_replay: Annotated[
        str | None,
        typer.Option(
            "--from-replay",
            help="Before going online, pre-train on this run's {RUN}.trajectories (read with assign + offsets up to "
            "the end, never joining a group): off-to-on training. Ignored when resuming from a checkpoint.",
            show_default="none",
        ),
    ] = None,
    replay_updates: Annotated[
        int, typer.Option("--replay-updates", help="Updates of the offline phase (with --from-replay).")
    ] = 100,
    replay_algorithm: Annotated[
        ReplayAlgorithm,
        typer.Option(
            "--replay-algorithm",
            help="Update rule of the offline phase: bc clones every replayed episode, filtered_bc the successful ones.",
        ),
    ] = ReplayAlgorithm.BC,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run one learner of the group {run}.learner until SIGTERM/Ctrl-C (or --max-updates).

    Resumes from its last checkpoint when there is one (same --run and --member). Every --updates-per-version
    updates (in round mode: after each round) it writes the adapter to the artifact store and publishes a weight
    version on {run}.weights. On SIGTERM/Ctrl-C it finishes the update in progress, writes a final checkpoint and
    exits 0. Logs go to stderr.
    """
    overrides: dict[str, Any] = {
        "run": run,
        "data_dir": data_dir,
        "kafka": {"bootstrap_servers": bootstrap},
        "model": {"base": model},
        "learner": {
            "algorithm": algorithm,
            "init_adapter": init_adapter,
            "member_id": member,
            "round_episodes": round_episodes,
            "drop_above_policy_lag": drop_above_policy_lag,
            "updates_per_version": updates_per_version,
            "max_updates": max_updates,
            "checkpoint_interval_updates": checkpoint_interval,
            "threads": threads,
            "metrics_port": metrics_port,
            "tensorboard_dir": tensorboard_dir,
        },
    }
    cfg = build_config(config, **overrides)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()
    # SIGTERM (docker stop, kill) ends the run as Ctrl-C does: the update in progress finishes, then a checkpoint.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from distrl_stream.learner.role import run_learner  # keeps `--help` free of torch and transformers

    learner = run_command(
        run_learner,
        cfg,
        stop,
        from_replay=from_replay,
        replay_updates=replay_updates,
        replay_algorithm=replay_algorithm.value,
    )
    counters = learner.counters
    err_console.print(
        f"learner {cfg.learner.member_id} stopped at update {learner.trainer.updates}, version {learner.version}: "
        f"{counters.ingested} trajectories ingested, {counters.stale} stale, {counters.dead} dead-lettered",
        highlight=False,
    )
