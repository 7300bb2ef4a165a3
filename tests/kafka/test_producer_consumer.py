"""Producer and consumer wrappers against a real broker: exact round trips, keys, order, manual commits."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from distrl_stream.config import Config
from distrl_stream.errors import KafkaClientError
from distrl_stream.events import TrajectoryEvent, decode
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.testing.samples import sample_trajectory
from tests.fixtures.kafka import consume

pytestmark = pytest.mark.kafka


def test_thousand_trajectories_arrive_exactly_keyed_by_episode_and_in_order_per_partition(
    run_config: Config, run_topics: TopicNames, unique_name: Callable[[str], str]
) -> None:
    rng = random.Random(42)
    sent = [sample_trajectory(rng, run=run_config.run, steps=rng.randint(1, 20)) for _ in range(1000)]
    with Producer(run_config.kafka, client_id="test-collector") as producer:
        for event in sent:
            producer.produce_event(run_topics.trajectories, event)
        stats = producer.flush()
    assert (stats.delivered, stats.failed) == (1000, 0)

    with Consumer(run_config.kafka, group_id=unique_name("learner")) as consumer:
        consumer.subscribe([run_topics.trajectories])
        messages = consume(consumer, 1000, timeout_s=60)
    by_id = {e.episode_id: e for e in sent}
    order_by_partition: dict[int, list[str]] = defaultdict(list)
    for msg in messages:
        event = decode(msg.value(), expect=TrajectoryEvent)
        assert msg.key() == event.episode_id.encode()
        assert event == by_id[event.episode_id]
        order_by_partition[msg.partition()].append(event.episode_id)
    assert sorted(by_id) == sorted(e for ids in order_by_partition.values() for e in ids)
    assert len(order_by_partition) == run_config.kafka.trajectory_partitions  # keys spread over all partitions
    sent_order = {e.episode_id: i for i, e in enumerate(sent)}
    for ids in order_by_partition.values():
        assert ids == sorted(ids, key=sent_order.__getitem__)


def test_only_processed_and_committed_records_are_skipped_by_the_group_after_a_restart(
    run_config: Config, make_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = make_topic()
    group = unique_name("group")
    with Producer(run_config.kafka) as producer:
        for i in range(10):
            producer.produce(topic, f"m{i}".encode())
        producer.flush()
    with Consumer(run_config.kafka, group_id=group) as consumer:
        consumer.subscribe([topic])
        first = consume(consumer, 10)
        for msg in first[:6]:
            consumer.processed(msg)
        consumer.commit()
    with Consumer(run_config.kafka, group_id=group) as consumer:
        consumer.subscribe([topic])
        again = consume(consumer, 4)
        assert [m.value() for m in again] == [f"m{i}".encode() for i in range(6, 10)]
        assert consumer.poll(1.0) is None


def test_batch_consume_returns_each_partitions_records_in_order(
    run_config: Config, make_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = make_topic(partitions=2)
    with Producer(run_config.kafka) as producer:
        for i in range(50):
            producer.produce(topic, str(i).encode(), partition=i % 2)
        producer.flush()
    got: list = []
    with Consumer(run_config.kafka, group_id=unique_name("batch")) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            got.extend(consumer.consume(20, 1.0))
    assert len(got) == 50
    for partition in (0, 1):
        assert [int(m.value()) for m in got if m.partition() == partition] == list(range(partition, 50, 2))


def test_producer_counts_failed_deliveries_and_flush_reports_them(run_config: Config) -> None:
    # A topic that does not exist (auto-creation is off): librdkafka gives up once the metadata says so.
    producer = Producer(run_config.kafka, overrides={"message.timeout.ms": 3000})
    producer.produce(f"{run_config.run}.no-such-topic", b"x")
    with pytest.raises(KafkaClientError, match="1 messages failed delivery since the last flush"):
        producer.flush(timeout_s=20)
    assert producer.stats.failed == 1
    assert producer.stats.delivered == 0
    producer.close()


def test_partitions_and_watermarks_describe_a_topic_and_a_missing_topic_is_a_typed_error(
    run_config: Config, make_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = make_topic(partitions=3)
    with Producer(run_config.kafka) as producer:
        for i in range(5):
            producer.produce(topic, f"m{i}".encode(), partition=1)
        producer.flush()
    with Consumer(run_config.kafka) as consumer:
        assert consumer.partitions(topic) == [0, 1, 2]
        assert consumer.watermarks(topic) == {0: (0, 0), 1: (0, 5), 2: (0, 0)}
        assert consumer.watermarks(topic, [1]) == {1: (0, 5)}
        missing = unique_name("missing")
        with pytest.raises(KafkaClientError, match=f"cannot read {missing}: "):
            consumer.partitions(missing, timeout_s=10)


def test_assign_from_start_reads_every_partition_and_positions_follow_the_reads(
    run_config: Config, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=2)
    with Producer(run_config.kafka) as producer:
        for i in range(6):
            producer.produce(topic, f"m{i}".encode(), partition=i % 2)
        producer.flush()
    with Consumer(run_config.kafka) as consumer:
        assert consumer.assign_from_start(topic) == [0, 1]
        messages = consume(consumer, 6)
        assert sorted(m.value() for m in messages) == [f"m{i}".encode() for i in range(6)]
        assert consumer.positions(topic, [0, 1]) == {0: 3, 1: 3}
        consumer.assign_offsets(topic, {1: 2})
        assert [m.value() for m in consume(consumer, 1)] == [b"m5"]


def test_a_paused_consumer_fetches_nothing_until_resumed(run_config: Config, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    with Producer(run_config.kafka) as producer:
        producer.produce(topic, b"held")
        producer.flush()
    with Consumer(run_config.kafka) as consumer:
        consumer.assign_from_start(topic, [0])
        consumer.pause()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert consumer.poll(0.2) is None
        consumer.resume()
        assert [m.value() for m in consume(consumer, 1)] == [b"held"]


def test_committed_offsets_are_what_the_admin_reads_back_for_the_group(
    run_config: Config, make_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = make_topic(partitions=2)
    group = unique_name("group")
    admin = Admin(run_config.kafka)
    assert all(offset < 0 for offset in admin.committed_offsets(group, topic, [0, 1]).values())
    with Consumer(run_config.kafka, group_id=group) as consumer:
        consumer.commit_offsets(topic, {0: 3, 1: 1})
    assert admin.committed_offsets(group, topic, [0, 1]) == {0: 3, 1: 1}


def test_an_asynchronous_commit_lands_by_close_and_a_failed_one_is_logged_when_a_poll_hears_of_it(
    run_config: Config,
    make_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(partitions=2)
    group = unique_name("group")
    with Consumer(run_config.kafka, group_id=group) as consumer:
        consumer.commit_offsets(topic, {0: 2, 1: 5}, asynchronous=True)  # no poll: close() waits for the answer
    assert Admin(run_config.kafka).committed_offsets(group, topic, [0, 1]) == {0: 2, 1: 5}
    with Consumer(run_config.kafka, group_id=group) as consumer:
        consumer.commit_offsets(unique_name("missing"), {0: 1}, asynchronous=True)
        deadline = time.monotonic() + 30
        while "an asynchronous commit failed" not in caplog.text and time.monotonic() < deadline:
            consumer.poll(0.2)
    assert "an asynchronous commit failed" in caplog.text and "[0]: Broker: Unknown topic or partition" in caplog.text
