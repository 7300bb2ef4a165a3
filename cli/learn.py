"""`distrl-stream learn`: the learner role: consume trajectories, train (A-RIDE or a baseline), publish versions."""

from __future__ import annotations

import logging
import os
import signal
import socket
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

# Options of the launcher (torchrun), not of each member: dropped from the members' command line.
LAUNCH_OPTIONS = ("--nproc-per-node", "--nnodes", "--rdzv-endpoint", "--max-restarts")


def member_args(argv: list[str]) -> list[str]:
    """The ``learn`` arguments of ``argv`` (``sys.argv``) without the launcher's options."""
    args = argv[argv.index("learn") + 1 :] if "learn" in argv else []
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in LAUNCH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in LAUNCH_OPTIONS)):
            out.append(arg)
    return out


def _free_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def launch_group(nproc_per_node: int, nnodes: str, rdzv_endpoint: str, max_restarts: int) -> None:
    """Run torch's elastic agent in this process, with this command's arguments for every member.

    Raises:
        typer.Exit: 1 when the group failed for good (restarts used up); the members' errors are in the log above.
    """
    # Imported here: keeps `--help` free of torch.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from distrl_stream.learner.group import AGENT_ENV, AGENT_PID_ENV, launch_command

    # The members arm Linux's parent-death signal against this pid (die_with_agent). Linux sends it when the *thread*
    # that started a member ends: torch's agent starts members (SubprocessHandler's Popen, restarts included)
    # synchronously in the thread that runs torchrun(), this process's main thread, which lives as long as the agent.
    os.environ.update({**AGENT_ENV, AGENT_PID_ENV: str(os.getpid())})
    args = launch_command(
        nproc_per_node, member_args(sys.argv), rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts, nnodes=nnodes
    )
    try:
        torchrun(args)
    except SignalException:
        # SIGTERM/Ctrl-C: the agent passed it on and waited for the members' final checkpoints; a clean stop.
        return
    except ChildFailedError as exc:
        err_console.print(f"error: learner group failed: {exc.get_first_failure()[1].message}", highlight=False)
        raise typer.Exit(1) from None


def learn(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    algorithm: Annotated[str | None, field_option("learner.algorithm", "--algorithm")] = None,
    model: Annotated[Path | None, field_option("model.base", "--model")] = None,
    init_adapter: Annotated[Path | None, field_option("learner.init_adapter", "--init-adapter")] = None,
    device: Annotated[str | None, field_option("learner.device", "--device")] = None,
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
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            min=1,
            help="Learner members on this host. Above 1 (or with --nnodes) the command re-runs itself under torch's "
            "elastic agent (torch.distributed.run): one policy, trained data-parallel by every member.",
        ),
    ] = 1,
    nnodes: Annotated[
        str,
        typer.Option("--nnodes", help="Hosts of the learner group: N, or MIN:MAX for an elastic group (torchrun's)."),
    ] = "1",
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(
            "--rdzv-endpoint",
            help="HOST:PORT of the group's c10d rendezvous (the same on every host). Default: a free local port "
            "(one host only).",
            show_default="a free local port",
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option("--max-restarts", min=0, help="Restarts of the group (from its checkpoint) after a member dies."),
    ] = 3,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the learner group {run}.learner until SIGTERM/Ctrl-C (or --max-updates): one member by default, N
    with --nproc-per-node N.

    Resumes from the group's last checkpoint when there is one (same --run). Every --updates-per-version updates (in
    round mode: after each round) rank 0 writes the adapter to the artifact store and publishes a weight version on
    {run}.weights. On SIGTERM/Ctrl-C the members finish the update in progress, write a final checkpoint and exit 0.
    Logs go to stderr.
    """
    if (nproc_per_node > 1 or nnodes != "1") and "RANK" not in os.environ:
        launch_group(nproc_per_node, nnodes, rdzv_endpoint or _free_endpoint(), max_restarts)
        return
    from distrl_stream.learner.group import die_with_agent  # keeps `--help` free of torch

    # First, before the member takes its lock or a partition: a member whose agent is gone must not start.
    run_command(die_with_agent)
    overrides: dict[str, Any] = {
        "run": run,
        "data_dir": data_dir,
        "kafka": {"bootstrap_servers": bootstrap},
        "model": {"base": model},
        "learner": {
            "algorithm": algorithm,
            "init_adapter": init_adapter,
            "device": device,
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
        f"learner {learner.member_id} stopped at update {learner.trainer.updates}, version {learner.version}: "
        f"{counters.ingested} trajectories ingested, {counters.stale} stale, {counters.dead} dead-lettered; "
        f"parameters sha256 {learner.parameter_hash()}",
        highlight=False,
    )
