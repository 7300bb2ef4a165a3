"""`distrl-stream monitor`: the live dashboard of a run (or one plain-text snapshot with --once)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from typing import Annotated

import typer

from distrl_stream.cli.common import BootstrapOption, ConfigOption, RunOption, build_config, fail, run_command
from distrl_stream.monitor.state import DEFAULT_WINDOWS_S


def monitor(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    once: Annotated[
        bool, typer.Option("--once", help="Print one plain-text snapshot and exit (for scripts and tests).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --once: print the snapshot as JSON.")] = False,
    history: Annotated[
        float, typer.Option("--history", help="Seconds of past metrics read first (attach to a running run).", min=0)
    ] = 600.0,
    window: Annotated[
        list[float] | None,
        typer.Option(
            "--window",
            help="Rolling window in seconds for throughput and success; repeatable.",
            min=1,
            show_default=" ".join(f"{w:g}" for w in DEFAULT_WINDOWS_S),
        ),
    ] = None,
    refresh: Annotated[float, typer.Option("--refresh", help="Seconds between screen updates.", min=0.1)] = 1.0,
) -> None:
    """Watch a run live: throughput, success, versions and lag, learner losses, latency, consumer lag, DLQ.

    Trajectories/min and success rate over rolling windows, per-collector rows, policy versions and the lag
    distribution, learner losses/ρ/entropy, inference latency, the learner group's lag and the dead-letter count.
    Reads recent history first, so it attaches to a run in progress. Ctrl-C quits.
    """
    from distrl_stream.monitor.live import snapshot_once, watch  # rich.live and Kafka clients: not for --help
    from distrl_stream.monitor.render import plain

    cfg = build_config(config, run=run, kafka={"bootstrap_servers": bootstrap})
    windows = tuple(sorted(window)) if window else DEFAULT_WINDOWS_S
    if as_json and not once:
        fail("--json needs --once (the live dashboard is not JSON)", code=2)
    if once:
        snap = run_command(snapshot_once, cfg, history_s=history, windows_s=windows)
        typer.echo(json.dumps(snap.to_dict(), indent=2) if as_json else plain(snap))
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the normal way out of a dashboard
        run_command(watch, cfg, stop, history_s=history, refresh_s=refresh, windows_s=windows)
