"""The learner's newest published policy version, followed from ``{run}.weights`` (for ``pause_above_policy_lag``
and the samples-per-insert limit)."""

from __future__ import annotations

import logging

from distrl_stream.config import Config
from distrl_stream.events import WeightVersionEvent
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.topics import TopicNames

log = logging.getLogger(__name__)


class PublishedVersions:
    """Reads ``{run}.weights`` from the start, without a group (every collector must see every version), and keeps
    the newest version of one policy. :meth:`poll` never blocks, so it runs on the collector's event loop.

    Records that do not decode go to ``{run}.dlq`` (once, whichever collector or server reads them first).

    Args:
        cfg: run, Kafka and policy id.
        client_id: names the consumer in broker logs.
    """

    def __init__(self, cfg: Config, client_id: str) -> None:
        self.topic = TopicNames(cfg.run).weights
        self.policy_id = cfg.model.policy_id
        self.latest = 0
        self.learner_step = 0  # the learner's update count when it published the newest version
        self._dead_letters = DeadLetterQueue(cfg.kafka, TopicNames(cfg.run).dlq, client_id)
        self._follower = TopicFollower(
            cfg.kafka, self.topic, WeightVersionEvent, client_id=client_id, dead_letters=self._dead_letters
        )

    def start(self, timeout_s: float = 30.0) -> None:
        """Assign every partition of the topic from its beginning (blocking metadata call: run it off the loop).

        Raises:
            KafkaClientError: the topic cannot be read.
        """
        self._follower.start(timeout_s=timeout_s)

    def poll(self) -> int:
        """Take in every version event already fetched (no waiting) and return the newest version seen."""
        for event in self._follower.take():
            if event.policy_id == self.policy_id and event.version > self.latest:
                log.info("learner published %s version %d", self.policy_id, event.version)
                self.latest = event.version
                self.learner_step = event.learner_step
        return self.latest

    def close(self) -> None:
        """Release the consumer and the dead-letter producers."""
        self._follower.close()
        self._dead_letters.close()
