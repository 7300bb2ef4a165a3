"""Samples-per-insert rate limiting of collection, as Reverb's ``SampleToInsertRatio`` does for its replay tables.

On shared cores every episode a collector runs takes CPU from the learner: collectors left alone produce far more
episodes than the learner can use and starve it (the demo once collected 1,161 episodes for 10 learner updates). The
limiter lets a collector start an episode only while the episodes inserted stay within what the learner has sampled:

    inserts ≤ samples / samples_per_insert + slack

- *inserts*: the episodes on ``{run}.trajectories``, every collector's: the sum of the partitions' high watermarks,
  re-read every ``collector.version_refresh_s``, plus what this collector published since and has in flight;
- *samples*: the episodes the learner drew, ``learner_step × learner.batch_episodes`` of its newest weight version
  on ``{run}.weights`` (no new protocol: the event already carries ``learner_step``);
- *slack*: ``learner.min_buffer_episodes`` (the learner samples nothing before it holds them) plus one version's
  worth of inserts, ``updates_per_version × batch_episodes / samples_per_insert`` (the collector hears of the
  learner's progress once per version).

The learner's consumed count (``trajectories_consumed``) would not do: the learner ingests whatever arrives within
milliseconds; what it cannot keep up with is the updates.
"""

from __future__ import annotations

import math

from distrl_stream.config import Config
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.topics import TopicNames


class InsertLimiter:
    """Whether one more episode fits the samples-per-insert budget (see the module docstring).

    Args:
        cfg: the run, Kafka, ``collector.samples_per_insert`` (must be set) and the learner's batch settings.
        client_id: names the watermark consumer in broker logs.
    """

    def __init__(self, cfg: Config, client_id: str) -> None:
        assert cfg.collector.samples_per_insert is not None
        self.samples_per_insert = cfg.collector.samples_per_insert
        self.batch_episodes = cfg.learner.batch_episodes
        learner = cfg.learner
        self.slack = learner.min_buffer_episodes + learner.updates_per_version * learner.batch_episodes / (
            self.samples_per_insert
        )
        self.topic = TopicNames(cfg.run).trajectories
        self.on_topic = 0  # episodes on the topic at the last refresh
        self._since = 0  # episodes this collector published since then
        self._consumer = Consumer(cfg.kafka, client_id=client_id)

    def refresh(self, timeout_s: float = 10.0) -> None:
        """Re-read the episodes on the topic (blocking broker calls: run it off the event loop).

        Raises:
            KafkaClientError: the cluster did not answer.
        """
        marks = self._consumer.watermarks(self.topic, timeout_s=timeout_s)
        self.on_topic = sum(high for _low, high in marks.values())
        self._since = 0

    def published(self) -> None:
        """Count an episode this collector just published (seen on the topic at the next refresh)."""
        self._since += 1

    def budget(self, learner_step: int) -> float:
        """The most episodes the topic may hold when the learner's newest version was at ``learner_step``."""
        return learner_step * self.batch_episodes / self.samples_per_insert + self.slack

    def allows(self, learner_step: int, in_flight: int) -> bool:
        """Whether one more episode fits, counting this collector's episodes in flight."""
        return self.on_topic + self._since + in_flight + 1 <= math.floor(self.budget(learner_step))

    def close(self) -> None:
        """Release the consumer."""
        self._consumer.close()
