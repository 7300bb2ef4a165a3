"""Prometheus metrics of the long-running roles: every metric name, its type and labels are defined here.

Each role (collector, learner, the server's weight watcher, ``up``) builds one :class:`RoleMetrics` subclass on a
registry of its own (not prometheus_client's global one, so tests and several roles in one process never collide)
and serves it over HTTP on its ``metrics_port``. Every sample carries the labels ``run``, ``role`` and ``source``
(collector id, learner member, server, ``up``), so one Prometheus can scrape many runs.

Two kinds of metric, chosen by where the number already lives:

- **read at scrape time** (:meth:`RoleMetrics.counter` / :meth:`RoleMetrics.gauge` with a reader): counts and state
  the role keeps anyway (its stats, counters, buffer, served version) are read when Prometheus scrapes, so the role
  counts each thing once and nothing can drift apart;
- **observed** (:meth:`RoleMetrics.histogram`): latencies and durations, which the role only sees as they happen.

docs/monitor.md lists every metric with its meaning and a scrape configuration.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from distrl_stream.errors import ConfigError
from distrl_stream.events import Termination

if TYPE_CHECKING:  # the roles import this module; it only reads their objects
    from distrl_stream.collector.stats import CollectorStats
    from distrl_stream.inference.client import Server
    from distrl_stream.learner.role import Counters

log = logging.getLogger(__name__)

IDENTITY = ("run", "role", "source")

# A reader returns one value, a mapping label value -> value (for a metric with one extra label), or None when the
# value is unknown yet (no sample is exported rather than a made-up 0).
Reader = Callable[[], float | Mapping[str, float] | None]

# Seconds. Inference on a CPU tiny model takes milliseconds, a GPU server under load up to seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Seconds. A simulated episode takes well under a second; an Android one minutes.
EPISODE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Versions the learner is ahead of the version that acted a step (0 = on-policy).
LAG_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50)
SUCCESS_WINDOW_EPISODES = 100


@dataclass(frozen=True)
class _Live:
    kind: str  # "counter" | "gauge"
    name: str
    doc: str
    read: Reader
    label: str | None


class _LiveCollector(Collector):
    """The read-at-scrape-time metrics of one role."""

    def __init__(self, identity: dict[str, str]) -> None:
        self.identity = identity
        self.metrics: list[_Live] = []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        for m in self.metrics:
            labels = [*IDENTITY, *([m.label] if m.label else [])]
            family_type = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            family = family_type(m.name, m.doc, labels=labels)
            value = m.read()
            if isinstance(value, Mapping):
                for key, v in sorted(value.items()):
                    family.add_metric([*self.identity.values(), key], float(v))
            elif value is not None:
                family.add_metric(list(self.identity.values()), float(value))
            yield family


class RoleMetrics:
    """One role's registry, the identity labels of its samples, and its HTTP endpoint.

    Args:
        run: the run name.
        role: ``collector``, ``learner``, ``inference`` or ``up``.
        source: which one of the role (collector id, learner member id, server, ...).
    """

    def __init__(self, run: str, role: str, source: str) -> None:
        self.registry = CollectorRegistry()
        self.identity = {"run": run, "role": role, "source": source}
        self._live = _LiveCollector(self.identity)
        self.registry.register(self._live)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def counter(self, name: str, doc: str, read: Reader, label: str | None = None) -> None:
        """A counter whose value (a running total the role keeps) is read at scrape time. ``name`` without _total."""
        self._live.metrics.append(_Live("counter", name, doc, read, label))

    def gauge(self, name: str, doc: str, read: Reader, label: str | None = None) -> None:
        """A gauge whose value is read at scrape time."""
        self._live.metrics.append(_Live("gauge", name, doc, read, label))

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        """A histogram the role observes into (already bound to the identity labels)."""
        return Histogram(name, doc, IDENTITY, buckets=buckets, registry=self.registry).labels(**self.identity)

    @property
    def port(self) -> int | None:
        """The port the endpoint listens on (None when not serving)."""
        return self._server.server_port if self._server is not None else None

    def serve(self, port: int | None, field: str) -> int | None:
        """Serve ``/metrics`` on all interfaces at ``port`` (0: a free one, logged; None: do nothing).

        Args:
            port: the configured port.
            field: the config field it came from, for the error.

        Returns:
            The port listened on, or None.

        Raises:
            ConfigError: the port cannot be bound (one line naming ``field``).
        """
        if port is None:
            return None
        try:
            self._server, self._thread = start_http_server(port, registry=self.registry)
        except OSError as exc:
            raise ConfigError(field, f"cannot serve metrics on port {port}: {exc.strerror or exc}") from None
        role, source = self.identity["role"], self.identity["source"]
        log.info("%s %s: Prometheus metrics on http://0.0.0.0:%d/metrics", role, source, self.port)
        return self.port

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None


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


class LearnerMetrics(RoleMetrics):
    """A learner's metrics.

    Args:
        run: the run.
        member_id: the learner's member id in its group.
        counters: its :class:`~distrl_stream.learner.role.Counters` (running totals, kept across restarts; a
            restore replaces the object, hence a callable).
        version: the newest version it published.
        updates: updates done.
        buffer: (episodes, steps, fill fraction) of the replay buffer.
        consumer_lag: records of ``{run}.trajectories`` on its partitions not yet used (None until measured).
        ingest_queue: decoded trajectories waiting for the trainer (None while not running).
    """

    def __init__(
        self,
        run: str,
        member_id: str,
        counters: Callable[[], Counters],
        *,
        version: Callable[[], int],
        updates: Callable[[], int | None],
        buffer: Callable[[], tuple[int, int, float]],
        consumer_lag: Callable[[], int | None],
        ingest_queue: Callable[[], int | None],
    ) -> None:
        super().__init__(run, "learner", member_id)
        self._update_stats: dict[str, float] = {}
        self._lock = threading.Lock()
        p = "distrl_learner"
        self.counter(
            f"{p}_trajectories",
            "Trajectories read, by what became of them (ingested into the buffer, or dropped as stale, incomplete "
            "or rejected).",
            lambda: {
                "ingested": counters().ingested,
                "stale": counters().stale,
                "incomplete": counters().incomplete,
                "rejected": counters().rejected,
            },
            "status",
        )
        self.counter(
            f"{p}_episodes_aged_out",
            "Ingested episodes removed from the replay buffer for being more than learner.max_sample_lag versions "
            "behind.",
            lambda: counters().aged_out,
        )
        self.counter(f"{p}_dlq_records", "Records of {run}.trajectories sent to the DLQ.", lambda: counters().dead)
        self.counter(f"{p}_versions_published", "Weight versions published.", lambda: counters().published)
        self.counter(f"{p}_updates", "Updates done.", updates)
        self.gauge(f"{p}_version", "Newest weight version published.", version)
        self.gauge(f"{p}_buffer_episodes", "Episodes in the replay buffer.", lambda: buffer()[0])
        self.gauge(f"{p}_buffer_steps", "Steps in the replay buffer.", lambda: buffer()[1])
        self.gauge(f"{p}_buffer_fill_ratio", "Replay buffer steps / capacity.", lambda: buffer()[2])
        self.gauge(
            f"{p}_consumer_lag_records",
            "Records on its partitions not yet used (high watermark − position).",
            consumer_lag,
        )
        self.gauge(f"{p}_ingest_queue_records", "Decoded trajectories waiting for the trainer.", ingest_queue)
        self.gauge(f"{p}_loss", "Last update's losses, by term.", lambda: self._stats("loss_"), "term")
        self.gauge(
            f"{p}_rho",
            "Last update's importance ratios ρ: mean, max, clipped_frac.",
            lambda: self._stats("rho_"),
            "stat",
        )
        self.gauge(
            f"{p}_update_stat",
            "Every other number of the last update's statistics, by its MetricEvent name.",
            lambda: self._stats(""),
            "stat",
        )
        self.policy_lag = self.histogram(
            f"{p}_policy_lag_versions", "Per ingested step: learner version − the version that acted.", LAG_BUCKETS
        )

    def update(self, stats: Mapping[str, float]) -> None:
        """Keep the statistics of the update just done (the numbers its MetricEvents average)."""
        with self._lock:
            self._update_stats = dict(stats)

    def _stats(self, prefix: str) -> dict[str, float]:
        with self._lock:
            stats = self._update_stats
        if prefix:
            return {k.removeprefix(prefix): v for k, v in stats.items() if k.startswith(prefix) and math.isfinite(v)}
        return {k: v for k, v in stats.items() if not k.startswith(("loss_", "rho_")) and math.isfinite(v)}


class WatcherMetrics(RoleMetrics):
    """The weight watcher's metrics (what the server serves).

    Args:
        run: the run.
        server: names the server (the watcher's source id).
        served_version: the newest version loaded (0 = the base model).
        published_version: the newest version of the policy seen on ``{run}.weights``.
        loaded_versions: adapter versions loaded now.
        refused: versions refused so far.
    """

    def __init__(
        self,
        run: str,
        server: str,
        *,
        served_version: Callable[[], int],
        published_version: Callable[[], int],
        loaded_versions: Callable[[], int],
        refused: Callable[[], int],
    ) -> None:
        super().__init__(run, "inference", server)
        self.loads = 0
        p = "distrl_inference"
        self.gauge(
            f"{p}_served_version", "Newest policy version the server serves (0: the base model).", served_version
        )
        self.gauge(
            f"{p}_published_version", "Newest version of the policy published on {run}.weights.", published_version
        )
        self.gauge(
            f"{p}_version_lag",
            "Versions the served version is behind the newest published.",
            lambda: max(published_version() - served_version(), 0),
        )
        self.gauge(f"{p}_loaded_versions", "Adapter versions loaded now (at most keep_versions).", loaded_versions)
        self.counter(f"{p}_version_loads", "Versions verified and loaded.", lambda: self.loads)
        self.counter(f"{p}_versions_refused", "Versions refused (bad checksum, missing, server error).", refused)
        self.load_duration = self.histogram(
            f"{p}_adapter_load_seconds", "Copy, verify and load of one version.", EPISODE_BUCKETS
        )

    def loaded(self, load_s: float) -> None:
        """Count one version loaded in ``load_s`` seconds."""
        self.loads += 1
        self.load_duration.observe(load_s)


class UpMetrics(RoleMetrics):
    """``up``'s own metrics: its child processes.

    Args:
        run: the run.
        processes: child name -> whether it is running.
        uptime_s: seconds since everything was up (None while starting).
    """

    def __init__(
        self, run: str, *, processes: Callable[[], Mapping[str, bool]], uptime_s: Callable[[], float | None]
    ) -> None:
        super().__init__(run, "up", "up")
        self.gauge(
            "distrl_up_process_running",
            "1 while the child process runs, 0 once it exited.",
            lambda: {name: float(running) for name, running in processes().items()},
            "process",
        )
        self.gauge("distrl_up_uptime_seconds", "Seconds since every role was started.", uptime_s)
