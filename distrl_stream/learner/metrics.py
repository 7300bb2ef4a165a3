"""A learner member's counters and its Prometheus metrics, read from them at scrape time (docs/monitor.md lists
them)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from distrl_stream.monitor.prometheus import LAG_BUCKETS, RoleMetrics


@dataclass
class Counters:
    """What the learner has done, cumulative over restarts (saved in checkpoints)."""

    ingested: int = 0  # episodes put in the buffer
    stale: int = 0  # dropped on arrival: more than drop_above_policy_lag versions behind
    incomplete: int = 0  # dropped: ended by an env/inference error or abandoned
    dead: int = 0  # undecodable or unusable records (dead-lettered)
    rejected: int = 0  # refused by the buffer (e.g. longer than its capacity)
    replayed: int = 0  # episodes loaded from another run's topic (--from-replay)
    published: int = 0  # weight versions published
    unannounced: int = 0  # versions written whose chunks or event the cluster did not acknowledge (an outage)
    not_uploaded: int = 0  # versions written that the object store refused after artifacts.upload_retries
    metrics_lost: int = 0  # metric events the cluster never acknowledged
    dead_letters_lost: int = 0  # dead letters the cluster never acknowledged (their records are skipped unrecorded)

    def as_dict(self) -> dict[str, int]:
        """Plain form for checkpoints."""
        return dict(self.__dict__)


# The update statistics distrl_learner_logp_mismatch_nats shows (its steps and updates_ahead go to update_stat).
_MISMATCH_NATS = ("logp_mismatch_mean", "logp_mismatch_max")


class LearnerMetrics(RoleMetrics):
    """A learner's metrics.

    Args:
        run: the run.
        member_id: the learner's member id in its group.
        counters: its :class:`Counters` (running totals, kept across restarts; a
            restore replaces the object, hence a callable).
        version: the newest version it published.
        updates: updates done.
        buffer: (episodes, steps, fill fraction) of the replay buffer.
        consumer_lag: records of ``{run}.trajectories`` on its partitions not yet used (None until measured).
        ingest_queue: decoded trajectories waiting for the trainer (None while not running).
        prompt_ids: (checked, mismatched) ingested steps' prompt ids (docs/design.md §6.2).
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
        prompt_ids: Callable[[], tuple[int, int]],
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
            f"{p}_logp_mismatch_nats",
            "|log π − log μ| of the last update's steps acted by the weights it computed with (no staleness in it: "
            "the inference/training mismatch; update_stat logp_mismatch_updates_ahead: policy steps since): mean, max.",
            lambda: {k: v for k, v in self._stats("logp_mismatch_").items() if k in ("mean", "max")},
            "stat",
        )
        self.counter(
            f"{p}_prompt_ids",
            "Ingested steps whose prompt ids the server recorded (checked), and those this learner's own rendering "
            "of the prompt would not have reproduced (mismatched; it trains on the server's).",
            lambda: {"checked": prompt_ids()[0], "mismatched": prompt_ids()[1]},
            "status",
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
        return {
            k: v
            for k, v in stats.items()
            if not k.startswith(("loss_", "rho_")) and k not in _MISMATCH_NATS and math.isfinite(v)
        }
