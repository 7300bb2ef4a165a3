"""A collector's Prometheus metrics, read from its stats at scrape time (docs/monitor.md lists them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from distrl_stream.collector.stats import CollectorStats
from distrl_stream.events import Termination
from distrl_stream.inference.client import Server
from distrl_stream.monitor.prometheus import (
    EPISODE_BUCKETS,
    LATENCY_BUCKETS,
    SUCCESS_WINDOW_EPISODES,
    RoleMetrics,
)


class CollectorMetrics(RoleMetrics):
    """A collector's metrics.

    Args:
        run: the run.
        collector_id: the collector.
        stats: its :class:`~distrl_stream.collector.stats.CollectorStats` (read at scrape time).
        in_flight: episodes running now.
        served_version: the newest version every reachable server serves, as the collector last read it.
        policy_lag: served version behind the learner's newest (None unless ``pause_above_policy_lag`` is set).
        servers: the inference client's server pool (requests and failovers per server).
    """

    def __init__(
        self,
        run: str,
        collector_id: str,
        stats: CollectorStats,
        *,
        in_flight: Callable[[], int],
        served_version: Callable[[], int | None],
        policy_lag: Callable[[], int | None],
        servers: Callable[[], Sequence[Server]],
    ) -> None:
        super().__init__(run, "collector", collector_id)
        self._recent: deque[bool] = deque(maxlen=SUCCESS_WINDOW_EPISODES)
        p = "distrl_collector"
        self.counter(
            f"{p}_episodes",
            "Episodes ended, by termination.",
            lambda: {t.value: stats.by_termination[t.value] for t in Termination if t is not Termination.ABANDONED},
            "termination",
        )
        self.counter(
            f"{p}_successes", "Episodes the environment judged successful.", lambda: stats.by_termination["success"]
        )
        self.counter(
            f"{p}_steps", "Steps taken (one inference request and one env step each).", lambda: stats.steps_total
        )
        self.counter(f"{p}_trajectories_published", "Trajectories handed to the producer.", lambda: stats.published)
        self.counter(f"{p}_trajectories_delivered", "Trajectories the broker acknowledged.", lambda: stats.delivered)
        self.counter(
            f"{p}_publish_failures", "Trajectories not queued or not delivered.", lambda: stats.publish_failures
        )
        self.counter(f"{p}_episodes_dropped", "Errored episodes not published.", lambda: stats.dropped)
        self.counter(f"{p}_episodes_abandoned", "Episodes cut off by shutdown.", lambda: stats.abandoned)
        self.gauge(
            f"{p}_success_rate",
            f"Success rate over the last {SUCCESS_WINDOW_EPISODES} episodes that ended.",
            lambda: sum(self._recent) / len(self._recent) if self._recent else None,
        )
        self.gauge(f"{p}_episodes_in_flight", "Episodes running now.", in_flight)
        self.gauge(f"{p}_policy_version", "Newest policy version the server serves.", served_version)
        self.gauge(f"{p}_policy_lag_versions", "Served version behind the learner's newest published.", policy_lag)
        self.counter(
            f"{p}_server_requests",
            "Action requests sent to each policy server (failed attempts included).",
            lambda: {s.url: s.requests for s in servers()},
            "server",
        )
        self.counter(
            f"{p}_server_failovers",
            "Requests that failed on a policy server and moved on to another.",
            lambda: {s.url: s.failovers for s in servers()},
            "server",
        )
        self.gauge(
            f"{p}_server_policy_version",
            "Newest policy version each policy server lists, as the collector last read it.",
            lambda: {s.url: s.newest for s in servers() if s.newest is not None},
            "server",
        )
        self.episode_duration = self.histogram(
            f"{p}_episode_duration_seconds", "Wall time of an episode, reset to end.", EPISODE_BUCKETS
        )
        self.inference_latency = self.histogram(
            f"{p}_inference_latency_seconds", "Round trip of one action request to the policy server.", LATENCY_BUCKETS
        )
        self.env_latency = self.histogram(f"{p}_env_latency_seconds", "One environment step.", LATENCY_BUCKETS)

    def step(self, inference_latency_s: float, env_latency_s: float) -> None:
        """Observe one finished step."""
        self.inference_latency.observe(inference_latency_s)
        self.env_latency.observe(env_latency_s)

    def episode(self, duration_s: float, success: bool) -> None:
        """Observe one ended episode."""
        self.episode_duration.observe(duration_s)
        self._recent.append(success)
