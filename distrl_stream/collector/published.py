"""The learner's newest published policy version, followed from ``{run}.weights`` (for ``pause_above_policy_lag``
and the samples-per-insert limit)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from distrl_stream.artifacts import base_fingerprint
from distrl_stream.artifacts.weights import base_mismatch, check_version_event
from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config
from distrl_stream.errors import KafkaClientError
from distrl_stream.events import WeightVersionEvent
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.policy.model_dir import resolve_model_dir

log = logging.getLogger(__name__)


class PublishedVersions(BackgroundFollower):
    """Reads ``{run}.weights`` from the start, without a group (every collector must see every version), in a
    background thread, and keeps the newest version of one policy.

    The thread does every Kafka read, and the dead-lettering of bad records with it (a transactional write: blocking
    broker calls, docs/kafka.md "Dead letters"), as the learner's and the servers' readers do; :meth:`poll` only
    reads what the thread last saw, so it runs on the collector's event loop. Records go through the readers' one
    check of weight events (``artifacts/weights.py``): impossible ones go to ``{run}.dlq`` (once, whichever
    collector or server reads them first), and a version of another base model than this collector's (its
    fingerprint) is not taken as the learner's, with one line saying so.

    Args:
        cfg: run, Kafka, model (policy id, base model) settings.
        client_id: names the consumer in broker logs.
        model_dir: this collector's base model folder, fingerprinted; default ``model.base`` or the local model.
    """

    thread_name = "published-versions"

    def __init__(self, cfg: Config, client_id: str, *, model_dir: Path | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.topic = TopicNames(cfg.run).weights
        self.policy_id = cfg.model.policy_id
        self.foreign: list[int] = []  # versions refused as adapters of another base model
        self._model_dir = model_dir
        self._lock = threading.Lock()
        self._latest = 0
        self._learner_step = 0
        self._dead_letters = DeadLetterQueue(cfg.kafka, TopicNames(cfg.run).dlq, client_id)
        self._follower = TopicFollower(
            cfg.kafka,
            self.topic,
            WeightVersionEvent,
            client_id=client_id,
            dead_letters=self._dead_letters,
            check=check_version_event,
        )

    @property
    def latest(self) -> int:
        """The newest version published (0: none yet)."""
        with self._lock:
            return self._latest

    @property
    def learner_step(self) -> int:
        """The learner's update count when it published the newest version."""
        with self._lock:
            return self._learner_step

    @property
    def dead_lettered(self) -> int:
        """Records of the topic that did not decode or were impossible (dead-lettered by this reader or another)."""
        return self._follower.undecodable

    def start(self, timeout_s: float = 30.0) -> None:
        """Assign every partition of the topic from its beginning (blocking metadata call: run it off the loop),
        then follow it in the background.

        Raises:
            KafkaClientError: the topic cannot be read.
        """
        self._follower.start(timeout_s=timeout_s)
        super().start()

    def poll(self) -> int:
        """The newest version seen so far (no waiting, no broker call).

        Raises:
            KafkaClientError: the reader thread ended on an error (an unreachable or refusing cluster, say).
        """
        failed = self.failed
        if isinstance(failed, KafkaClientError):
            raise failed
        if failed is not None:
            raise KafkaClientError(f"reading {self.topic} stopped: {type(failed).__name__}: {failed}") from failed
        return self.latest

    def close(self) -> None:
        """Stop the thread, then release the consumer and the dead-letter producers."""
        self.stop()
        self._follower.close()
        self._dead_letters.close()

    def _follow(self) -> None:
        fingerprint: str | None = None  # hashed on this thread at the first event that carries one (then cached)
        reader = f"this collector's model.base is {self.cfg.model.base_model_id!r}"
        while not self._stop.is_set():
            for event in self._follower.take(timeout_s=0.5):
                if event.policy_id != self.policy_id or event.version <= self.latest:
                    continue
                if fingerprint is None and event.base_fingerprint:
                    fingerprint = base_fingerprint(self.cfg, self._model_dir or resolve_model_dir(self.cfg))
                mismatch = base_mismatch(event, fingerprint or "", reader)
                if mismatch is not None:
                    log.error("not taken as the learner's newest version: %s", mismatch)
                    self.foreign.append(event.version)
                    continue
                log.info("learner published %s version %d", self.policy_id, event.version)
                with self._lock:
                    self._latest, self._learner_step = event.version, event.learner_step
