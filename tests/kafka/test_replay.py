"""read_topic: time-range replays through offsets_for_times, bounded by the watermarks taken at the start."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from distrl_stream.config import Config
from distrl_stream.errors import KafkaClientError
from distrl_stream.events import epoch_ms, from_epoch_ms, utc_now
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer

pytestmark = pytest.mark.kafka

HOUR_MS = 3600 * 1000


def _produce(config: Config, topic: str, batches: dict[str, int]) -> None:
    """Produce 20 records per batch prefix, timestamped at the given epoch ms plus their index."""
    with Producer(config.kafka) as producer:
        for i in range(20):
            for prefix, start_ms in batches.items():  # interleaved: time, not produce order, decides
                producer.produce(topic, f"{prefix}{i}".encode(), key=f"k{i % 7}", timestamp_ms=start_ms + i)
        producer.flush()


def test_replay_from_a_timestamp_returns_exactly_the_records_from_then_on(
    run_config: Config, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=3)
    t0 = epoch_ms(utc_now()) - 3 * HOUR_MS
    _produce(run_config, topic, {"early-": t0, "late-": t0 + HOUR_MS})
    later = [m.value().decode() for m in read_topic(run_config.kafka, topic, since=from_epoch_ms(t0 + HOUR_MS))]
    assert sorted(later) == sorted(f"late-{i}" for i in range(20))
    everything = list(read_topic(run_config.kafka, topic))
    assert len(everything) == 40


def test_replay_of_a_time_range_excludes_its_end(run_config: Config, make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=2)
    t0 = epoch_ms(utc_now()) - 3 * HOUR_MS
    _produce(run_config, topic, {"a": t0, "b": t0 + HOUR_MS, "c": t0 + 2 * HOUR_MS})
    middle = [
        m.value().decode() for m in read_topic(run_config.kafka, topic, since=t0 + HOUR_MS, until=t0 + 2 * HOUR_MS)
    ]
    assert sorted(middle) == sorted(f"b{i}" for i in range(20))


def test_replay_stops_at_the_watermark_taken_when_it_started(
    run_config: Config, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=2)
    _produce(run_config, topic, {"old": epoch_ms(utc_now())})
    seen = []
    with Producer(run_config.kafka) as producer:
        for msg in read_topic(run_config.kafka, topic):
            if not seen:  # records written during the replay are not part of it
                for i in range(5):
                    producer.produce(topic, f"new{i}".encode())
                producer.flush()
            seen.append(msg.value().decode())
    assert sorted(seen) == sorted(f"old{i}" for i in range(20))


def test_replay_of_a_missing_topic_is_a_clear_error(run_config: Config) -> None:
    with pytest.raises(KafkaClientError, match=r"cannot read .*\.missing"):
        list(read_topic(run_config.kafka, f"{run_config.run}.missing", timeout_s=10))
