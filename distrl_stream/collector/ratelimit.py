"""Samples-per-insert rate limiting of collection, as Reverb's ``SampleToInsertRatio`` does for its replay tables.

On shared cores every episode a collector runs takes CPU from the learner: collectors left alone produce far more
episodes than the learner can use and starve it (the demo once collected 1,161 episodes for 10 learner updates). The
limiter lets a collector start an episode only while the records on ``{run}.trajectories`` stay within
:func:`distrl_stream.pacing.insert_budget` of the learner's newest version (the rule, and why it cannot stall, live
there):

- *records on the topic*: every collector's, the sum of the partitions' high watermarks, re-read every
  ``collector.version_refresh_s``, plus what this collector published since and has in flight;
- *the learner's samples*: ``learner_step × learner.batch_episodes`` of its newest weight version on
  ``{run}.weights`` (no new protocol: the event already carries ``learner_step``).

The learner's consumed count (``trajectories_consumed``) would not do: the learner ingests whatever arrives within
milliseconds; what it cannot keep up with is the updates.
"""

from __future__ import annotations

from distrl_stream import pacing
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
        self._learner = cfg.learner
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
        """The most records the topic may hold when the learner's newest version was at ``learner_step``."""
        return pacing.insert_budget(
            learner_step,
            batch_episodes=self.batch_episodes,
            samples_per_insert=self.samples_per_insert,
            min_buffer_episodes=self._learner.min_buffer_episodes,
            updates_per_version=self._learner.updates_per_version,
        )

    def allows(self, learner_step: int, in_flight: int) -> bool:
        """Whether one more episode fits, counting this collector's episodes in flight."""
        return pacing.may_insert(self.on_topic + self._since, in_flight, self.budget(learner_step))

    def close(self) -> None:
        """Release the consumer."""
        self._consumer.close()
