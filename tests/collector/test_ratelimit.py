"""The samples-per-insert limit against a real broker: a collector pauses new episodes while the learner is behind
and resumes once a weight version shows it caught up (no policy server: only the gate is exercised)."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distrl_stream.artifacts import version_event
from distrl_stream.collector import Collector
from distrl_stream.collector.published import PublishedVersions
from distrl_stream.collector.ratelimit import InsertLimiter
from distrl_stream.config import Config, load_config
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.testing.samples import sample_trajectory


def test_the_budget_is_samples_over_the_ratio_plus_the_warm_up_and_one_version_from_the_first_update() -> None:
    cfg = load_config(
        collector={"samples_per_insert": 2.0},
        learner={"batch_episodes": 4, "min_buffer_episodes": 8, "updates_per_version": 5},
    )
    limiter = InsertLimiter(cfg, "test-inserts")
    assert limiter.budget(0) == math.inf  # no limit before the first update: the learner still fills its buffer
    assert limiter.budget(10) == 10 * 4 / 2 + 8 + 5 * 4 / 2  # the warm-up buffer and one version of slack
    limiter.close()


@pytest.mark.kafka
async def test_collector_pauses_while_the_learner_is_behind_and_resumes_when_it_catches_up(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    # Budget: none before the first update, then learner_step × 2 / 1 + (2 + 1 × 2 / 1) = 2·step + 4 episodes.
    cfg = make_config(
        collector={"samples_per_insert": 1.0, "version_refresh_s": 0.1},
        learner={"batch_episodes": 2, "min_buffer_episodes": 2, "updates_per_version": 1},
    )
    ensure_run_topics(cfg)
    topics = TopicNames(cfg.run)
    collector = Collector(cfg)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"x")

    def version(number: int, learner_step: int) -> None:
        event = version_event(
            cfg.model,
            number,
            adapter,
            adapter_uri=adapter.as_uri(),
            base_fingerprint="",
            learner_step=learner_step,
            trajectories_consumed=6,
        )
        producer.produce_event(topics.weights, event)
        producer.flush()

    with Producer(cfg.kafka, client_id="test") as producer:
        collector._published = PublishedVersions(cfg, "test-weights")
        collector._published.start()
        collector._limiter = InsertLimiter(cfg, "test-inserts")
        try:
            rng = random.Random(0)
            for _ in range(6):  # more than the slack: before the learner's first update nothing pauses
                producer.produce_event(topics.trajectories, sample_trajectory(rng, run=cfg.run, steps=2))
            producer.flush()
            assert await asyncio.wait_for(collector._fresh_enough(), 30)

            version(1, learner_step=1)  # one update of 2 episodes: budget 6, all taken
            deadline = time.monotonic() + 30
            while collector._published.poll() < 1:
                assert time.monotonic() < deadline, "version 1 never arrived"
                await asyncio.sleep(0.05)
            before_pause = time.monotonic()
            gate = asyncio.create_task(collector._fresh_enough())
            deadline = time.monotonic() + 30
            while not collector._paused:
                assert time.monotonic() < deadline, "the collector never paused"
                await asyncio.sleep(0.05)
            assert not gate.done()

            version(2, learner_step=2)  # budget 8 for 6 inserted episodes: the next one may start
            assert await asyncio.wait_for(gate, 30)
            resumed_by = time.monotonic()
            assert not collector._paused
            # The pause is counted (paused_s in its metrics), and no more than it lasted.
            assert 0 < collector._paused_s <= resumed_by - before_pause
        finally:
            collector._published.close()
            collector._limiter.close()
