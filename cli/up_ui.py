"""The terminal side of `distrl-stream up`: stage spinners, the process table under the dashboard, and signals.

:class:`~distrl_stream.orchestrate.LocalStack` starts and stops the processes; this module shows it happening and
turns Ctrl-C, SIGTERM, SIGHUP and the end of ``--duration`` into an ordered stop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console, RenderableType
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from distrl_stream.config import Config
from distrl_stream.errors import DistrlError
from distrl_stream.orchestrate import LocalStack, UpOptions, UpSummary


@contextlib.contextmanager
def signals_stop(handler: Callable[[], None]) -> Iterator[None]:
    """Run ``handler`` on SIGTERM and SIGHUP while the block runs (``up`` stops in order, as on Ctrl-C)."""
    previous = {sig: signal.signal(sig, lambda *_: handler()) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Stages:
    """Rich progress lines for the slow starts and the ordered stop (spinner, then a tick and the time taken)."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(finished_text="[green]✓[/]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, name: str, state: str) -> None:
        if state == "start":
            self._tasks[name] = self.progress.add_task(name, total=1)
        elif name in self._tasks:
            self.progress.update(self._tasks[name], completed=1)

    def __enter__(self) -> _Stages:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def run_up(
    cfg: Config,
    options: UpOptions,
    child_env: dict[str, str],
    *,
    duration_s: float | None = None,
    monitor: bool = True,
    report: bool = True,
    console: Console | None = None,
) -> UpSummary:
    """Bring the run up, show the monitor until ``duration_s`` passes, Ctrl-C, SIGTERM or a role fails, then stop
    everything in order and summarise.

    Returns:
        The summary; ``failure`` is set when a role died or the start failed.
    """
    console = console or Console()
    stack = LocalStack(cfg, options, child_env)
    stop = threading.Event()
    failure: list[str] = []

    def supervise() -> None:
        deadline = time.monotonic() + duration_s if duration_s else None
        while not stop.wait(1.0):
            problem = stack.failure()
            if problem is not None:
                failure.append(problem)
                stop.set()
            elif deadline is not None and time.monotonic() >= deadline:
                stop.set()

    starting = threading.Event()

    def on_signal() -> None:
        stop.set()
        if starting.is_set():
            stack.abort_start()  # abort a start in progress (a vLLM start can take minutes) as Ctrl-C does

    with signals_stop(on_signal):
        try:
            starting.set()
            with _Stages(console) as stages:
                stack.start(stages)
            starting.clear()
            threading.Thread(target=supervise, name="up-supervisor", daemon=True).start()
            if stack.metrics_targets:
                console.print(scrape_targets(stack))
            if monitor:
                from distrl_stream.monitor.live import watch

                watch(stack.cfg, stop, console=console, footer=lambda: process_table(stack, duration_s))
            else:
                console.print(f"run {stack.cfg.run} is up; stop with Ctrl-C", highlight=False)
                stop.wait()
        except KeyboardInterrupt:
            pass
        except DistrlError as exc:
            failure.append(str(exc))
        finally:
            starting.clear()
            # A second Ctrl-C while stopping kills what is left at once instead of aborting the cleanup.
            previous = signal.signal(signal.SIGINT, lambda *_: stack.kill())
            try:
                with _Stages(console) as stages:
                    stages("stopping", "start")
                    codes = stack.stop(stages)
                    stages("stopping", "done")
                summary = stack.summarize(codes, "\n".join(failure) or None, report)
                stack.stop_broker()
            finally:
                stack.kill()
                signal.signal(signal.SIGINT, previous)
    return summary


def scrape_targets(stack: LocalStack) -> Table:
    """The Prometheus endpoints of `up` and its children, and the file_sd file that lists them."""
    table = Table("process", "metrics", box=None, pad_edge=False, title_justify="left")
    for name, address in stack.metrics_targets.items():
        table.add_row(name, f"http://{address}/metrics")
    table.title = f"Prometheus scrape targets (file_sd: {stack.cfg.run_dir / 'prometheus-targets.json'})"
    return table


def process_table(stack: LocalStack, duration_s: float | None) -> RenderableType:
    """The processes of `up` (name, pid, state, log, metrics endpoint) and how long the run has gone, for under the
    dashboard."""
    table = Table("process", "pid", "state", "log", box=None, pad_edge=False, title_justify="left")
    if stack.metrics_targets:
        table.add_column("metrics")
    for child in stack.children():
        code = child.returncode
        state = "[green]running[/]" if code is None else f"[red]exited {code}[/]" if code else "exited 0"
        row = [child.name, str(child.pid), state, str(child.log_path)]
        if stack.metrics_targets:
            row.append(stack.metrics_targets.get(child.name, "-"))
        table.add_row(*row)
    if stack.started_at is not None:
        ran = time.monotonic() - stack.started_at
        left = f", {max(0.0, duration_s - ran):.0f} s left" if duration_s else ", Ctrl-C stops everything in order"
        table.title = f"up for {ran:.0f} s{left}"
    return table
