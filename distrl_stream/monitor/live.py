"""The monitor's loops: one snapshot (``--once``) or the live dashboard, on a :class:`MetricFeed`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live

from distrl_stream.config import Config
from distrl_stream.events import utc_now
from distrl_stream.monitor.feed import MetricFeed
from distrl_stream.monitor.render import dashboard
from distrl_stream.monitor.state import DEFAULT_WINDOWS_S, MonitorState, Snapshot

# Consumer lag and DLQ size are admin round trips: refresh them less often than the metric tail.
_KAFKA_REFRESH_S = 5.0


def snapshot_once(
    cfg: Config, *, history_s: float = 600.0, windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S
) -> Snapshot:
    """Read the last ``history_s`` of the run's metrics and Kafka's numbers, and return what the dashboard would show.

    Raises:
        KafkaClientError: the run's topics do not exist or the cluster did not answer.
    """
    state = MonitorState(cfg.run, windows_s)
    feed = MetricFeed(cfg, state, history_s=history_s)
    try:
        feed.backfill()
        feed.refresh_kafka()
    finally:
        feed.close()
    return state.snapshot(utc_now())


def watch(
    cfg: Config,
    stop: threading.Event,
    *,
    history_s: float = 600.0,
    refresh_s: float = 1.0,
    windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S,
    console: Console | None = None,
    footer: Callable[[], RenderableType | None] | None = None,
) -> Snapshot:
    """Show the live dashboard until ``stop`` is set; returns the last snapshot.

    Args:
        cfg: the run to watch.
        stop: set it to end the loop (Ctrl-C handling stays with the caller).
        history_s: how much history to read first (a monitor attaching to a running run).
        refresh_s: seconds between screen updates.
        windows_s: rolling windows of throughput and success.
        console: where to draw (default: stdout).
        footer: extra lines under the dashboard (``up`` shows its processes there).

    Raises:
        KafkaClientError: the run's topics do not exist or the cluster did not answer.
    """
    state = MonitorState(cfg.run, windows_s)
    feed = MetricFeed(cfg, state, history_s=history_s)
    last_kafka = 0.0

    def render() -> RenderableType:
        snap = state.snapshot(utc_now())
        extra = footer() if footer is not None else None
        return dashboard(snap) if extra is None else Group(dashboard(snap), extra)

    try:
        feed.backfill()
        with Live(render(), console=console, refresh_per_second=4, transient=False) as live:
            while not stop.is_set():
                feed.poll(refresh_s)
                if time.monotonic() - last_kafka > _KAFKA_REFRESH_S:
                    feed.refresh_kafka()
                    last_kafka = time.monotonic()
                state.prune(utc_now())
                live.update(render())
    finally:
        feed.close()
    return state.snapshot(utc_now())
