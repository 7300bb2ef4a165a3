"""Statistics of a replayed run: episodes, success by task, episode lengths, policy-version lag, latencies.

Pure functions of :class:`~distrl_stream.analysis.replay.EpisodeSummary` lists (and the weight versions), so they
are tested without Kafka.

**Version lag** of a step = the newest policy version that existed when its episode ended − the version that acted
(never below 0). "Existed" means published on ``{run}.weights`` (``created_at``) or already seen acting in an earlier
episode: the weights topic is compacted, so on an old run only the latest version may be left, and the trajectories
themselves still tell when each version was in use. This is the staleness the learner has to correct for, measured
from the data alone.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from distrl_stream.analysis.replay import EpisodeSummary
from distrl_stream.events import WeightVersionEvent


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample: count, mean, median, 95th percentile and maximum (zeros when empty)."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p95: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """Summarise ``values``."""
        if len(values) == 0:
            return cls()
        a = np.asarray(values, dtype=np.float64)
        return cls(len(a), float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 95)), float(a.max()))


@dataclass(frozen=True, slots=True)
class TaskStats:
    """Outcomes of one task template (a sim template, a MiniWoB task, ...)."""

    task: str
    episodes: int
    successes: int
    mean_length: float

    @property
    def success_rate(self) -> float:
        """Fraction of the task's episodes that succeeded."""
        return self.successes / self.episodes if self.episodes else 0.0


@dataclass(frozen=True)
class ReplayStats:
    """Everything ``replay stats`` prints (``to_dict`` for JSON)."""

    episodes: int = 0
    steps: int = 0
    successes: int = 0
    invalid_steps: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    terminations: dict[str, int] = field(default_factory=dict)
    by_task: list[TaskStats] = field(default_factory=list)
    by_collector: dict[str, int] = field(default_factory=dict)
    by_split: dict[str, int] = field(default_factory=dict)
    length: Distribution = Distribution()
    duration_s: Distribution = Distribution()
    version_lag: Distribution = Distribution()
    lag_histogram: dict[int, int] = field(default_factory=dict)
    min_policy_version: int = 0
    max_policy_version: int = 0
    versions_published: int = 0
    inference_latency_s: Distribution = Distribution()
    env_latency_s: Distribution = Distribution()

    @property
    def success_rate(self) -> float:
        """Fraction of episodes that succeeded."""
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def span_s(self) -> float:
        """Seconds between the first and the last episode's end."""
        return (self.last_at - self.first_at).total_seconds() if self.first_at and self.last_at else 0.0

    @property
    def trajectories_per_min(self) -> float:
        """Episodes per minute over the span (0 when the span is empty)."""
        return 60.0 * self.episodes / self.span_s if self.span_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601)."""
        d = asdict(self)
        d["first_at"] = self.first_at.isoformat() if self.first_at else None
        d["last_at"] = self.last_at.isoformat() if self.last_at else None
        d["by_task"] = [{**asdict(t), "success_rate": t.success_rate} for t in self.by_task]
        d["lag_histogram"] = {str(k): v for k, v in sorted(self.lag_histogram.items())}
        d["success_rate"] = self.success_rate
        d["span_s"] = self.span_s
        d["trajectories_per_min"] = self.trajectories_per_min
        return d


def step_lags(episodes: Sequence[EpisodeSummary], weights: Sequence[WeightVersionEvent] = ()) -> list[list[int]]:
    """Per episode (in the given order), the version lag of each step (see the module docstring)."""
    # When each version became known: its publication, else the end of the first episode that used it.
    known_at: dict[int, datetime] = {w.version: w.created_at for w in weights}
    for e in episodes:
        for v in set(e.policy_versions):
            if v not in known_at or e.ended_at < known_at[v]:
                known_at[v] = e.ended_at
    timeline = sorted(known_at.items(), key=lambda kv: kv[1])
    times = [t for _, t in timeline]
    newest_so_far = np.maximum.accumulate([v for v, _ in timeline]).tolist() if timeline else []
    lags = []
    for e in episodes:
        i = bisect.bisect_right(times, e.ended_at)
        newest = newest_so_far[i - 1] if i else 0
        lags.append([max(0, newest - v) for v in e.policy_versions])
    return lags


def compute_stats(episodes: Sequence[EpisodeSummary], weights: Sequence[WeightVersionEvent] = ()) -> ReplayStats:
    """Aggregate replayed episodes (any order) and the run's weight versions into :class:`ReplayStats`."""
    if not episodes:
        return ReplayStats(versions_published=len({w.version for w in weights}))
    lags = [lag for per_episode in step_lags(episodes, weights) for lag in per_episode]
    per_task: dict[str, list[EpisodeSummary]] = defaultdict(list)
    for e in episodes:
        per_task[e.task_template or e.task_id].append(e)
    by_task = [
        TaskStats(task, len(es), sum(e.success for e in es), float(np.mean([e.length for e in es])))
        for task, es in sorted(per_task.items())
    ]
    versions = [v for e in episodes for v in e.policy_versions]
    return ReplayStats(
        episodes=len(episodes),
        steps=sum(e.length for e in episodes),
        successes=sum(e.success for e in episodes),
        invalid_steps=sum(e.invalid_steps for e in episodes),
        first_at=min(e.ended_at for e in episodes),
        last_at=max(e.ended_at for e in episodes),
        terminations=dict(Counter(e.termination for e in episodes).most_common()),
        by_task=by_task,
        by_collector=dict(sorted(Counter(e.collector_id for e in episodes).items())),
        by_split=dict(sorted(Counter(e.split for e in episodes).items())),
        length=Distribution.of([e.length for e in episodes]),
        duration_s=Distribution.of([e.duration_s for e in episodes]),
        version_lag=Distribution.of(lags),
        lag_histogram=dict(sorted(Counter(lags).items())),
        min_policy_version=min(versions, default=0),
        max_policy_version=max(versions, default=0),
        versions_published=len({w.version for w in weights}),
        inference_latency_s=Distribution.of([x for e in episodes for x in e.inference_latency_s]),
        env_latency_s=Distribution.of([x for e in episodes for x in e.env_latency_s]),
    )
