"""The tailer against a real broker: it reads the whole topic through the backfill, never in a consumer group, and
starts over when the topic it indexed was deleted and created again."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from distrl_stream.config import Config
from distrl_stream.events import TrajectoryEvent, encode, event_key
from distrl_stream.explorer.index import Filters, Index
from distrl_stream.explorer.tailer import Tailer
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics
from distrl_stream.testing.samples import sample_trajectory

pytestmark = pytest.mark.kafka


def _publish(cfg: Config, topics: TopicNames, count: int, seed: int) -> set[str]:
    rng = random.Random(seed)
    events: list[TrajectoryEvent] = [sample_trajectory(rng, run=cfg.run, steps=2) for _ in range(count)]
    with Producer(cfg.kafka) as producer:
        for i, event in enumerate(events):
            producer.produce(topics.trajectories, encode(event), event_key(event), partition=i % 2)
        producer.flush()
    return {e.episode_id for e in events}


def _indexed(cfg: Config, index: Index, expected: int) -> set[str]:
    """Tail until the index holds ``expected`` episodes (a deadline, not a sleep), then stop."""
    tailer = Tailer(cfg.kafka, cfg.run, index, first_chunk=1, backfill_chunk=2)
    tailer.open()
    tailer.start()
    try:
        deadline = time.monotonic() + 20
        while (total := index.episodes(Filters())[1]) < expected or not tailer.coverage().complete:
            assert time.monotonic() < deadline, f"{total} of {expected} episodes indexed in 20 s"
            time.sleep(0.1)
    finally:
        tailer.stop()
    rows, _ = index.episodes(Filters(), page_size=1000)
    return {r.episode_id for r in rows}


def test_the_whole_topic_is_indexed_without_a_group_and_again_after_it_was_recreated(
    run_config: Config, run_topics: TopicNames, kafka_admin: Admin, tmp_path: Path
) -> None:
    groups_before = set(kafka_admin.client.list_consumer_groups().result().valid)
    index = Index(tmp_path / "i.sqlite", {"run": run_config.run, "bootstrap_servers": "b"})
    first = _publish(run_config, run_topics, 9, seed=1)
    assert _indexed(run_config, index, 9) == first
    delete_run_topics(run_config, kafka_admin)
    ensure_run_topics(run_config, kafka_admin)
    # More records than before, so the old offsets look valid: only the topics' new ids tell them apart.
    second = _publish(run_config, run_topics, 12, seed=2)
    assert _indexed(run_config, index, 12) == second  # nothing of the deleted topic is left
    groups_after = set(kafka_admin.client.list_consumer_groups().result().valid)
    assert {g.group_id for g in groups_after} == {g.group_id for g in groups_before}
