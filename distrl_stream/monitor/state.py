"""What the monitor knows about a run, aggregated from MetricEvents: pure, so it is tested without Kafka.

Inputs are the roles' :class:`~distrl_stream.events.MetricEvent` s on ``{run}.metrics`` (fed in any order of
sources, each source in time order) plus two numbers read from Kafka itself (the learner group's consumer lag and the
DLQ's record count). :meth:`MonitorState.snapshot` turns them into a :class:`Snapshot` for the renderers.

Rolling windows are computed from the collectors' **cumulative counters** (``episodes_total``,
``episodes_success``), interpolated linearly at the window's start: a missed report loses nothing, a monitor that
attaches late still gets exact windows from the history it read, and a collector that restarts under the same id
(its counters fall back to 0) is continued, not subtracted.

Metric names read (as the roles publish them, see docs/monitor.md): collectors ``episodes_total``,
``episodes_success``, ``policy_version``, ``in_flight``, ``paused``, ``inference_latency_p50_s``/``_p95_s``,
``env_latency_p50_s``, ``uptime_s``; the learner ``version``, ``updates``, ``updates_per_s``, losses, ``entropy``,
``rho_*``, ``logp_mismatch_mean``, ``policy_lag_mean``/``_p95``/``_max``, ``trajectories_ingested``,
``buffer_fill``; the inference watcher ``policy_version`` with ``labels.event = loaded`` (or ``refused``), one
source per policy server, shown per server with its lag behind the learner's newest version. A final report
(``labels.event = final``) marks a source stopped.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from distrl_stream.events import MetricEvent

DEFAULT_WINDOWS_S = (60.0, 300.0)
# A source that has not reported for this many of its own report intervals is shown as stale.
_STALE_INTERVALS = 3.0
_MIN_STALE_S = 30.0
# Learner values shown in the dashboard, in this order.
LEARNER_KEYS = (
    "loss_policy",
    "loss_critic",
    "entropy",
    "rho_mean",
    "rho_max",
    "rho_clipped_frac",
    # |log π − log μ| on steps of the weights' own version: the inference/training mismatch (bf16, kernels).
    "logp_mismatch_mean",
    "value_error",
    "buffer_fill",
)


@dataclass
class _Counter:
    """A cumulative counter over time, continued across restarts of its source (values falling back to 0)."""

    times: list[datetime] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    _offset: float = 0.0
    _last_raw: float = 0.0

    def add(self, t: datetime, raw: float, origin: datetime | None = None) -> None:
        """Record ``raw`` at ``t``; ``origin``: when the source started counting from 0 (known from its uptime)."""
        if self.times and t < self.times[-1]:
            return  # an older report than one already seen: a monotonic counter cannot go back
        if raw < self._last_raw:  # the source restarted and counts from 0 again
            self._offset += self._last_raw
        self._last_raw = raw
        if not self.times and origin is not None and origin < t:
            self.times.append(origin)
            self.values.append(0.0)
        self.times.append(t)
        self.values.append(self._offset + raw)

    @property
    def began(self) -> datetime | None:
        return self.times[0] if self.times else None

    def at(self, t: datetime) -> float:
        """The counter's value at ``t`` by linear interpolation (the first value before it, the last after it)."""
        if not self.times:
            return 0.0
        if t <= self.times[0]:
            return self.values[0]
        i = bisect.bisect_right(self.times, t)
        if i >= len(self.times):
            return self.values[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        span = (t1 - t0).total_seconds()
        return v0 if span <= 0 else v0 + (v1 - v0) * (t - t0).total_seconds() / span

    @property
    def latest(self) -> float:
        return self.values[-1] if self.values else 0.0

    def prune(self, before: datetime) -> None:
        """Forget points older than ``before`` but keep one at or before it, so interpolation there still works."""
        i = bisect.bisect_left(self.times, before)
        if i > 1:
            del self.times[: i - 1]
            del self.values[: i - 1]


@dataclass
class _Source:
    """One role instance as last reported."""

    role: str
    source_id: str
    first_seen: datetime
    last_seen: datetime
    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    interval_s: float = 0.0
    stopped: bool = False


@dataclass(frozen=True)
class CollectorRow:
    """One collector in the dashboard."""

    source_id: str
    status: str  # running | paused | stale | stopped
    episodes: int
    per_min: float
    success: float | None
    policy_version: int | None
    in_flight: int
    inference_p50_s: float | None
    inference_p95_s: float | None
    env_p50_s: float | None


@dataclass(frozen=True)
class ServerRow:
    """One policy server in the dashboard, from its weight watcher's reports.

    Attributes:
        source_id: the server (the watcher's source id, ``<host>:<port>`` by default).
        policy_version: the newest version it reported loaded (0: only the base model).
        lag: versions it is behind the learner's newest (None while no learner has reported).
        last_event: what it reported last: ``loaded`` or ``refused`` (a version it would not load).
        last_seen: when it reported last.
    """

    source_id: str
    policy_version: int
    lag: int | None
    last_event: str
    last_seen: datetime


@dataclass(frozen=True)
class WindowRate:
    """Throughput and success over one rolling window."""

    window_s: float
    per_min: float
    episodes: float
    success: float | None


@dataclass(frozen=True)
class Snapshot:
    """Everything the dashboard shows at one moment (``to_dict`` for JSON)."""

    run: str
    at: datetime
    events_seen: int
    first_event_at: datetime | None
    rates_at: datetime
    windows: list[WindowRate]
    episodes_total: int
    success_total: float | None
    collectors: list[CollectorRow]
    learners: dict[str, dict[str, float]]
    learner_version: int | None
    versions_published: int | None
    served_version: int | None
    served_by: list[str]
    servers: list[ServerRow]
    acting_versions: dict[int, int]
    policy_lag: dict[str, float]
    inference_latency: dict[str, float]
    consumer_lag: int | None
    dlq_records: int | None

    @property
    def per_min(self) -> float:
        """Trajectories per minute over the shortest window."""
        return self.windows[0].per_min if self.windows else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "run": self.run,
            "at": self.at.isoformat(),
            "events_seen": self.events_seen,
            "first_event_at": self.first_event_at.isoformat() if self.first_event_at else None,
            "rates_at": self.rates_at.isoformat(),
            "windows": [vars(w) for w in self.windows],
            "episodes_total": self.episodes_total,
            "success_total": self.success_total,
            "collectors": [vars(c) for c in self.collectors],
            "learners": self.learners,
            "learner_version": self.learner_version,
            "versions_published": self.versions_published,
            "served_version": self.served_version,
            "served_by": self.served_by,
            "servers": [{**vars(r), "last_seen": r.last_seen.isoformat()} for r in self.servers],
            "acting_versions": {str(k): v for k, v in self.acting_versions.items()},
            "policy_lag": self.policy_lag,
            "inference_latency": self.inference_latency,
            "consumer_lag": self.consumer_lag,
            "dlq_records": self.dlq_records,
        }


class MonitorState:
    """Aggregates a run's metric events into dashboard snapshots.

    Args:
        run: the run (events of other runs are ignored).
        windows_s: rolling windows for throughput and success, shortest first.
    """

    def __init__(self, run: str, windows_s: Iterable[float] = DEFAULT_WINDOWS_S) -> None:
        self.run = run
        self.windows_s = tuple(sorted(windows_s))
        self.events_seen = 0
        self.first_event_at: datetime | None = None
        self.last_event_at: datetime | None = None
        self._sources: dict[tuple[str, str], _Source] = {}
        self._episodes: dict[str, _Counter] = {}
        self._successes: dict[str, _Counter] = {}
        self._consumer_lag: int | None = None
        self._dlq_records: int | None = None

    def add(self, event: MetricEvent) -> None:
        """Take one metric event into account."""
        if event.run != self.run:
            return
        self.events_seen += 1
        t = event.timestamp
        self.first_event_at = t if self.first_event_at is None else min(self.first_event_at, t)
        self.last_event_at = t if self.last_event_at is None else max(self.last_event_at, t)
        key = (event.role, event.source_id)
        source = self._sources.get(key)
        if source is None:
            source = self._sources[key] = _Source(event.role, event.source_id, t, t)
        elif t >= source.last_seen:
            source.interval_s = (t - source.last_seen).total_seconds() or source.interval_s
        else:
            return  # an older report of a source already seen (history overlap): the newest values stand
        source.last_seen = t
        source.stopped = event.labels.get("event") == "final"
        # The inference watcher reports per load; keep what it reported last for each value.
        source.values.update(event.values)
        source.labels.update(event.labels)
        if event.role == "collector" and "episodes_total" in event.values:
            uptime = event.values.get("uptime_s")
            origin = t - timedelta(seconds=uptime) if uptime is not None else None
            values = event.values
            self._episodes.setdefault(event.source_id, _Counter()).add(t, values["episodes_total"], origin)
            self._successes.setdefault(event.source_id, _Counter()).add(t, values.get("episodes_success", 0.0), origin)

    def set_kafka(self, *, consumer_lag: int | None, dlq_records: int | None) -> None:
        """Numbers read from Kafka: the learner group's lag on ``{run}.trajectories`` and the DLQ's records."""
        self._consumer_lag = consumer_lag
        self._dlq_records = dlq_records

    def prune(self, now: datetime) -> None:
        """Drop counter history older than the longest window (the dashboard runs for days without growing)."""
        before = now - timedelta(seconds=self.windows_s[-1] if self.windows_s else 0.0)
        for counter in (*self._episodes.values(), *self._successes.values()):
            counter.prune(before)

    def snapshot(self, now: datetime) -> Snapshot:
        """The dashboard's content at ``now``."""
        collectors = [s for s in self._sources.values() if s.role == "collector"]
        learners = [s for s in self._sources.values() if s.role == "learner"]
        servers = [s for s in self._sources.values() if s.role == "inference"]
        rows = [self._collector_row(s, now) for s in sorted(collectors, key=lambda s: s.source_id)]
        # A finished run (every collector stopped or silent) is shown as of its last report, not as an idle now.
        ended = bool(rows) and all(r.status in ("stopped", "stale") for r in rows)
        rates_at = self.last_event_at if ended and self.last_event_at is not None else now
        if rates_at != now:
            rows = [
                self._collector_row(s, rates_at, status_at=now) for s in sorted(collectors, key=lambda s: s.source_id)
            ]
        total = sum(c.latest for c in self._episodes.values())
        successes = sum(c.latest for c in self._successes.values())
        learner_values = {s.source_id: dict(s.values) for s in sorted(learners, key=lambda s: s.source_id)}
        versions = [int(s.values["version"]) for s in learners if "version" in s.values]
        published = [int(s.values["versions_published"]) for s in learners if "versions_published" in s.values]
        served = [(int(s.values["policy_version"]), s.source_id) for s in servers if "policy_version" in s.values]
        learner_version = max(versions) if versions else None
        server_rows = [
            ServerRow(
                source_id=s.source_id,
                policy_version=int(s.values["policy_version"]),
                lag=max(learner_version - int(s.values["policy_version"]), 0) if learner_version is not None else None,
                last_event=s.labels.get("event", ""),
                last_seen=s.last_seen,
            )
            for s in sorted(servers, key=lambda s: s.source_id)
            if "policy_version" in s.values
        ]
        acting: dict[int, int] = {}
        for row in rows:
            if row.policy_version is not None and (ended or row.status != "stopped"):
                acting[row.policy_version] = acting.get(row.policy_version, 0) + 1
        return Snapshot(
            run=self.run,
            at=now,
            events_seen=self.events_seen,
            first_event_at=self.first_event_at,
            rates_at=rates_at,
            windows=[self._window(w, rates_at) for w in self.windows_s],
            episodes_total=int(total),
            success_total=successes / total if total else None,
            collectors=rows,
            learners=learner_values,
            learner_version=learner_version,
            versions_published=max(published) if published else None,
            served_version=max(v for v, _ in served) if served else None,
            served_by=sorted(source for _, source in served),
            servers=server_rows,
            acting_versions=dict(sorted(acting.items())),
            policy_lag=_policy_lag(learners),
            inference_latency=_latency(collectors if ended else [c for c in collectors if not c.stopped]),
            consumer_lag=self._consumer_lag,
            dlq_records=self._dlq_records,
        )

    def _window(self, window_s: float, now: datetime) -> WindowRate:
        start = now - timedelta(seconds=window_s)
        episodes = sum(c.at(now) - c.at(start) for c in self._episodes.values())
        successes = sum(c.at(now) - c.at(start) for c in self._successes.values())
        # A run younger than the window is measured over its own age, not diluted by the empty time before it.
        began = min((c.began for c in self._episodes.values() if c.began is not None), default=now)
        span = min(window_s, (now - began).total_seconds())
        per_min = 60.0 * episodes / span if span > 0 else 0.0
        return WindowRate(window_s, per_min, episodes, successes / episodes if episodes > 0 else None)

    def _collector_row(self, source: _Source, now: datetime, status_at: datetime | None = None) -> CollectorRow:
        v = source.values
        short = self.windows_s[0] if self.windows_s else 60.0
        start = now - timedelta(seconds=short)
        episodes = self._episodes.get(source.source_id)
        successes = self._successes.get(source.source_id)
        done = episodes.at(now) - episodes.at(start) if episodes else 0.0
        won = successes.at(now) - successes.at(start) if successes else 0.0
        span = min(short, (now - episodes.began).total_seconds()) if episodes and episodes.began else 0.0
        return CollectorRow(
            source_id=source.source_id,
            status=_status(source, status_at or now),
            episodes=int(episodes.latest) if episodes else 0,
            per_min=60.0 * done / span if span > 0 else 0.0,
            success=won / done if done > 0 else None,
            policy_version=int(v["policy_version"]) if "policy_version" in v else None,
            in_flight=int(v.get("in_flight", 0)),
            inference_p50_s=v.get("inference_latency_p50_s"),
            inference_p95_s=v.get("inference_latency_p95_s"),
            env_p50_s=v.get("env_latency_p50_s"),
        )


def _status(source: _Source, now: datetime) -> str:
    if source.stopped:
        return "stopped"
    silent = (now - source.last_seen).total_seconds()
    if silent > max(_MIN_STALE_S, _STALE_INTERVALS * source.interval_s):
        return "stale"
    return "paused" if source.values.get("paused") else "running"


def _policy_lag(learners: list[_Source]) -> dict[str, float]:
    """The learner's view of staleness: lag of the trajectories it trained on (worst over group members)."""
    out: dict[str, float] = {}
    for key in ("policy_lag_mean", "policy_lag_p95", "policy_lag_max"):
        values = [s.values[key] for s in learners if key in s.values]
        if values:
            out[key.removeprefix("policy_lag_")] = max(values)
    return out


def _latency(collectors: list[_Source]) -> dict[str, float]:
    """Inference and env latency over ``collectors``: median of their p50s, worst of their p95s."""
    out: dict[str, float] = {}
    for key, name, pick in (
        ("inference_latency_p50_s", "inference_p50_s", _median),
        ("inference_latency_p95_s", "inference_p95_s", max),
        ("env_latency_p50_s", "env_p50_s", _median),
        ("env_latency_p95_s", "env_p95_s", max),
    ):
        values = [s.values[key] for s in collectors if key in s.values]
        if values:
            out[name] = pick(values)
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
