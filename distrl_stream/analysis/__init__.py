"""Offline analysis of a run's topics: replay trajectories by time range or offsets, summarise, export, plot.

- :mod:`.replay`: :func:`read_trajectories` (on :func:`distrl_stream.kafka.consumer.read_topic`: no consumer group,
  bounded by the watermarks taken at the start) and :class:`EpisodeSummary`, the compact per-episode record the
  statistics and plots are computed from.
- :mod:`.stats`: :func:`compute_stats` (episodes, success by task, lengths, policy-version lag, latencies).
- :mod:`.export`: Parquet and JSONL, one row per episode or per step.
- :mod:`.report`: PNG plots and a Markdown summary.
"""

from distrl_stream.analysis.replay import (
    EpisodeSummary,
    ReadCounts,
    ReplaySelection,
    TrajectoryRecord,
    read_trajectories,
    read_weight_versions,
)
from distrl_stream.analysis.stats import ReplayStats, compute_stats

__all__ = [
    "EpisodeSummary",
    "ReadCounts",
    "ReplaySelection",
    "ReplayStats",
    "TrajectoryRecord",
    "compute_stats",
    "read_trajectories",
    "read_weight_versions",
]
