"""A stand-in learner that publishes a new policy version the moment a round's trajectories are in.

The synchronous baseline waits for the learner after every round, so it needs versions to keep coming. To measure
collection alone (``bench/collection.py``) and to test round behaviour, :class:`InstantLearner` takes zero time to
"train": it counts trajectories acted by the newest version on ``{run}.trajectories`` and, once a round's worth is
in, publishes the next version on ``{run}.weights``, pointing at a real LoRA adapter folder, so the real weight
watcher verifies and hot-loads it. This is the most favourable learner sync mode can have.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from distrl_stream.artifacts import atomic_dir, publish, version_event
from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config, ModelConfig
from distrl_stream.events import TrajectoryEvent, decode
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames

log = logging.getLogger(__name__)


def write_noop_adapter(model_dir: Path, out: Path, model: ModelConfig) -> Path:
    """Write a fresh LoRA adapter of the learner's own shape (``learner.trainer.lora_config``) into ``out``.

    peft initialises B = 0, so served it acts as the base model. Written atomically (readers see all of it or
    nothing). Needs torch and peft, imported here so that the learner double itself stays light.
    """
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from distrl_stream.learner.trainer import lora_config

    torch.manual_seed(model.seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, lora_config(model, base))
    with atomic_dir(out) as tmp:
        peft_model.save_pretrained(tmp)
    return out


def publish_version(
    cfg: Config, producer: Producer, version: int, adapter: Path, *, base_fingerprint: str = "", consumed: int = 0
) -> None:
    """Put ``adapter`` in ``artifacts.store`` and announce it as ``version`` of ``cfg.model.policy_id`` on
    ``{run}.weights`` (the event is queued; flush to wait). ``base_fingerprint`` "": servers do not check the base."""
    uri = publish(cfg, version, adapter, producer)
    event = version_event(
        cfg.model,
        version,
        adapter,
        adapter_uri=uri,
        base_fingerprint=base_fingerprint,
        learner_step=0,
        trajectories_consumed=consumed,
    )
    producer.produce_event(TopicNames(cfg.run).weights, event)


class InstantLearner(BackgroundFollower):
    """Publishes version v+1 as soon as ``round_episodes`` trajectories acted by version v (or attempts without a
    step, whose version nothing tells) are on the topic.

    Runs in a daemon thread; :attr:`published` lists ``(version, monotonic time)`` of each version it published.

    Args:
        cfg: run, Kafka and policy id.
        adapter: the adapter folder every version points at (e.g. from :func:`write_noop_adapter`).
        round_episodes: trajectories per round (the sync collectors' total number of envs).
        start_version: the version being served when it starts.
        base_fingerprint: the base model's fingerprint put on every version ("": servers do not check it).
    """

    thread_name = "instant-learner"

    def __init__(
        self, cfg: Config, adapter: Path, round_episodes: int, start_version: int = 0, base_fingerprint: str = ""
    ) -> None:
        super().__init__()
        self.base_fingerprint = base_fingerprint
        self.cfg = cfg
        self.adapter = adapter
        self.round_episodes = round_episodes
        self.version = start_version
        self.consumed = 0
        self.published: list[tuple[int, float]] = []

    def _follow(self) -> None:
        topics = TopicNames(self.cfg.run)
        consumer = Consumer(self.cfg.kafka, client_id="instant-learner")
        producer = Producer(self.cfg.kafka, client_id="instant-learner")
        try:
            consumer.assign_from_start(topics.trajectories, range(self.cfg.kafka.trajectory_partitions))
            in_round = 0
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                event = decode(msg.value(), TrajectoryEvent)
                self.consumed += 1
                # As the learner's round mode: an attempt that failed before its first step counts too.
                if not event.steps or event.steps[-1].policy_version == self.version:
                    in_round += 1
                if in_round >= self.round_episodes:
                    self.version += 1
                    in_round = 0
                    publish_version(
                        self.cfg,
                        producer,
                        self.version,
                        self.adapter,
                        base_fingerprint=self.base_fingerprint,
                        consumed=self.consumed,
                    )
                    producer.flush(30.0)
                    self.published.append((self.version, time.monotonic()))
                    log.info("published version %d after %d trajectories", self.version, self.consumed)
        finally:
            consumer.close()
            producer.close()
