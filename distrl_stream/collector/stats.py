"""What a collector measures, and the MetricEvent values it reports every ``metrics_interval_s``.

Counters (episodes by termination, publish failures, abandoned episodes) are totals since the start, so a monitor
that misses a report loses nothing. Rates, latency percentiles, success rate and mean episode length describe the
interval since the previous report, so they follow what the collector does now.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from distrl_stream.events import Termination


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by linear interpolation (numpy's default); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class _Window:
    """What happened since the last report."""

    started: float
    episodes: int = 0
    successes: int = 0
    episode_steps: int = 0
    steps: int = 0
    inference_latency: list[float] = field(default_factory=list)
    env_latency: list[float] = field(default_factory=list)


class CollectorStats:
    """Counters and per-interval measurements of one collector; all methods run on the collector's event loop."""

    def __init__(self) -> None:
        self._now = time.monotonic
        self.started = self._now()
        self.by_termination: Counter[str] = Counter()
        self.published = 0
        self.delivered = 0
        self.dropped = 0
        self.produce_failures = 0
        self.delivery_failures = 0
        self.abandoned = 0
        self.abandoned_ids: list[str] = []
        self.steps_total = 0
        self.rounds = 0
        self._window = _Window(self.started)

    @property
    def publish_failures(self) -> int:
        """Trajectories that could not be queued, or whose delivery the broker never acknowledged."""
        return self.produce_failures + self.delivery_failures

    @property
    def episodes(self) -> int:
        """Episodes that ended (any termination except abandoned)."""
        return sum(self.by_termination.values())

    def step(self, inference_latency_s: float, env_latency_s: float) -> None:
        """Count one finished step."""
        self.steps_total += 1
        self._window.steps += 1
        self._window.inference_latency.append(inference_latency_s)
        self._window.env_latency.append(env_latency_s)

    def episode(self, termination: Termination, steps: int) -> None:
        """Count one ended episode (published or not)."""
        self.by_termination[termination.value] += 1
        window = self._window
        window.episodes += 1
        window.episode_steps += steps
        window.successes += termination is Termination.SUCCESS

    def abandon(self, episode_id: str) -> None:
        """Count an episode cut off by shutdown (never published)."""
        self.abandoned += 1
        self.abandoned_ids.append(episode_id)

    def snapshot(
        self, *, policy_version: int, in_flight: int, paused: bool, extra: dict[str, float] | None = None
    ) -> dict[str, float]:
        """The MetricEvent values for the interval since the previous snapshot, which starts a new interval.

        Keys: ``episodes_per_min``, ``steps_per_s``, ``success_rate``, ``mean_episode_length``,
        ``inference_latency_p50_s`` / ``_p95_s``, ``env_latency_p50_s`` / ``_p95_s`` (interval; the last six are left
        out when the interval had no episode or step), ``policy_version``, ``in_flight``, ``paused`` (1 while
        held back by ``pause_above_policy_lag``), ``episodes_total``, ``episodes_<termination>``, ``published``,
        ``delivered``, ``dropped``, ``publish_failures``, ``abandoned``, ``steps_total``, ``rounds``, ``uptime_s``,
        plus ``extra``.
        """
        now = self._now()
        window, self._window = self._window, _Window(now)
        elapsed = max(now - window.started, 1e-9)
        values: dict[str, float] = {
            "episodes_per_min": window.episodes * 60.0 / elapsed,
            "steps_per_s": window.steps / elapsed,
            "policy_version": float(policy_version),
            "in_flight": float(in_flight),
            "paused": float(paused),
            "episodes_total": float(self.episodes),
            "published": float(self.published),
            "delivered": float(self.delivered),
            "dropped": float(self.dropped),
            "publish_failures": float(self.publish_failures),
            "abandoned": float(self.abandoned),
            "steps_total": float(self.steps_total),
            "rounds": float(self.rounds),
            "uptime_s": now - self.started,
        }
        for termination in Termination:
            if termination is not Termination.ABANDONED:
                values[f"episodes_{termination.value}"] = float(self.by_termination[termination.value])
        if window.episodes:
            values["success_rate"] = window.successes / window.episodes
            values["mean_episode_length"] = window.episode_steps / window.episodes
        if window.steps:
            values["inference_latency_p50_s"] = percentile(window.inference_latency, 0.5)
            values["inference_latency_p95_s"] = percentile(window.inference_latency, 0.95)
            values["env_latency_p50_s"] = percentile(window.env_latency, 0.5)
            values["env_latency_p95_s"] = percentile(window.env_latency, 0.95)
        values.update(extra or {})
        return values
