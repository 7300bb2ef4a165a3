"""Prometheus metrics: the registry and HTTP endpoint every long-running role shares.

Each role (collector, learner, the server's weight watcher, ``up``) declares its metrics next to the counters they
read, as one :class:`RoleMetrics` subclass (``collector/metrics.py``, ``learner/metrics.py``,
``inference/metrics.py``, ``orchestrate.py``), so this package imports no role. Each builds it on a
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
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from distrl_stream.errors import ConfigError

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
