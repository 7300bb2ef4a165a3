"""Collectors: K environments acting with the served policy, each finished episode published to Kafka.

::

    from distrl_stream.collector import Collector, run_collector

    report = run_collector(cfg)              # until SIGTERM/SIGINT, max_episodes or duration_s
    report = await Collector(cfg).run()      # the same inside a running event loop

See docs/collector.md.
"""

from distrl_stream.collector.collector import (
    Collector,
    CollectorReport,
    default_collector_id,
    run_collector,
)
from distrl_stream.collector.episode import EpisodeOutcome, run_episode
from distrl_stream.collector.published import PublishedVersions
from distrl_stream.collector.stats import CollectorStats, percentile

__all__ = [
    "Collector",
    "CollectorReport",
    "CollectorStats",
    "EpisodeOutcome",
    "PublishedVersions",
    "default_collector_id",
    "percentile",
    "run_collector",
    "run_episode",
]
