"""The broker goes away and comes back while a collector runs: every finished episode lands exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distrl_stream.collector import Collector
from distrl_stream.config import Config
from distrl_stream.kafka.broker import EmbeddedBroker
from tests.collector.conftest import assert_complete, trajectories
from tests.fixtures.kafka import TEST_BROKER_PROPERTIES

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


async def test_broker_restart_while_collecting_keeps_every_finished_episode_exactly_once(
    collector_config: Callable[..., Config], kafka_home: Path, tmp_path: Path
) -> None:
    # A broker of its own: the session's broker serves every other test.
    broker = EmbeddedBroker(tmp_path / "broker", kafka_home=kafka_home, properties=TEST_BROKER_PROPERTIES)
    bootstrap = await asyncio.to_thread(broker.start)
    try:
        cfg = collector_config(
            kafka={"bootstrap_servers": bootstrap},
            # Few envs and slow steps: little CPU for the episodes, so the broker's JVM restarts quickly beside them.
            collector={"envs": 4},
            env={"latency": "lognormal", "latency_mean_s": 0.2},
        )
        collector = Collector(cfg)
        run = asyncio.create_task(collector.run())
        stats = collector.stats
        await _until(lambda: stats.delivered >= 4, 120, "4 delivered trajectories")

        await asyncio.to_thread(broker.stop)
        down_at = stats.published
        await _until(lambda: stats.published >= down_at + 4, 120, "4 episodes finished while the broker is down")
        assert not run.done()
        queued = stats.published - stats.delivered
        assert queued >= 4  # they wait in the producer, not lost and not failed

        assert await asyncio.to_thread(broker.start) == bootstrap  # same address: the producer reconnects by itself
        back_at = stats.published
        await _until(
            lambda: stats.published >= back_at + 2 and stats.delivered == stats.published, 120, "delivery to catch up"
        )
        collector.request_stop("test done")
        report = await asyncio.wait_for(run, 60)

        assert report.publish_failures == 0 and report.undelivered == 0
        assert report.delivered == report.published
        events = trajectories(cfg)
        ids = [e.episode_id for e in events]
        assert len(ids) == len(set(ids)) == report.published  # every finished episode, none twice
        for event in events:
            assert_complete(event, cfg)
    finally:
        await asyncio.to_thread(broker.stop)
