"""The monitor's Kafka feed: recent history then the live tail (each event once), group lag, DLQ count."""

from __future__ import annotations

import io
import re
import threading
from datetime import timedelta

import pytest
from confluent_kafka import TopicPartition
from rich.console import Console
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import Config
from distrl_stream.events import MetricEvent, encode, epoch_ms, event_key, utc_now
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.monitor.feed import MetricFeed
from distrl_stream.monitor.live import watch
from distrl_stream.monitor.state import MonitorState

pytestmark = pytest.mark.kafka


def _metric(cfg: Config, source: str, total: float, age_s: float = 0.0) -> MetricEvent:
    return MetricEvent(
        run=cfg.run,
        role="collector",
        source_id=source,
        timestamp=utc_now() - timedelta(seconds=age_s),
        values={"episodes_total": total, "episodes_success": 0.0},
        labels={},
    )


def _publish(cfg: Config, topic: str, events: list[MetricEvent]) -> None:
    with Producer(cfg.kafka) as producer:
        for e in events:  # the record timestamp is the event's: history is cut by Kafka time
            producer.produce(topic, encode(e), event_key(e), timestamp_ms=epoch_ms(e.timestamp))
        producer.flush()


def test_history_is_read_first_then_each_new_event_once(run_config: Config, run_topics: TopicNames) -> None:
    old = _metric(run_config, "old", 1.0, age_s=3600)
    recent = [_metric(run_config, "c0", float(i), age_s=60 - i) for i in range(3)]
    _publish(run_config, run_topics.metrics, [old, *recent])
    state = MonitorState(run_config.run)
    feed = MetricFeed(run_config, state, history_s=600)
    try:
        assert feed.backfill() == 3  # the hour-old event is outside the history window
        _publish(run_config, run_topics.metrics, [_metric(run_config, "c1", 5.0)])
        got = 0
        for _ in range(40):
            got += feed.poll(0.5)
            if got:
                break
        assert got == 1
        assert feed.poll(0.5) == 0
    finally:
        feed.close()
    snap = state.snapshot(utc_now())
    assert sorted(c.source_id for c in snap.collectors) == ["c0", "c1"]
    assert snap.events_seen == 4


def test_group_lag_and_dead_letters_come_from_kafka(run_config: Config, run_topics: TopicNames) -> None:
    with Producer(run_config.kafka) as producer:
        for i in range(10):
            producer.produce(run_topics.trajectories, b"x", str(i).encode(), partition=0)
        for i in range(3):
            producer.produce(run_topics.dlq, b"y", str(i).encode())
        producer.flush()
    state = MonitorState(run_config.run)
    feed = MetricFeed(run_config, state)
    try:
        feed.refresh_kafka()
        assert state.snapshot(utc_now()).consumer_lag is None  # no learner has committed anything yet
        assert state.snapshot(utc_now()).dlq_records == 3
        with Consumer(run_config.kafka, group_id=TopicNames(run_config.run).learner_group) as learner:
            learner.client.commit(offsets=[TopicPartition(run_topics.trajectories, 0, 4)], asynchronous=False)
        feed.refresh_kafka()
        assert state.snapshot(utc_now()).consumer_lag == 6
    finally:
        feed.close()


def test_monitor_once_prints_a_snapshot_of_a_running_run(run_config: Config, run_topics: TopicNames) -> None:
    _publish(
        run_config, run_topics.metrics, [_metric(run_config, "c0", 0.0, age_s=60), _metric(run_config, "c0", 30.0)]
    )
    result = CliRunner().invoke(
        app, ["monitor", "--once", "--run", run_config.run, "-b", run_config.kafka.bootstrap_servers]
    )
    assert result.exit_code == 0, result.output
    # 30 episodes in the minute before the last report; the snapshot is taken a few seconds later.
    per_min = float(re.search(r"throughput \(1 min\): ([\d.]+) trajectories/min", result.output).group(1))
    assert 20.0 < per_min <= 30.0
    assert "c0 running: 30 episodes" in result.output


def test_the_live_dashboard_draws_until_stopped(run_config: Config, run_topics: TopicNames) -> None:
    _publish(run_config, run_topics.metrics, [_metric(run_config, "c0", 0.0, age_s=30), _metric(run_config, "c0", 9.0)])
    out = io.StringIO()
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)
    timer.start()
    try:
        last = watch(run_config, stop, refresh_s=0.2, console=Console(file=out, width=140, force_terminal=False))
    finally:
        timer.cancel()
    assert last.episodes_total == 9
    assert f"run {run_config.run}" in out.getvalue() and "c0" in out.getvalue()
