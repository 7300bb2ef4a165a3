"""TopicFollower against a real broker: a whole topic from its start (or given offsets), outside any group."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from distrl_stream.config import Config
from distrl_stream.errors import KafkaClientError
from distrl_stream.events import MetricEvent, default_serde, utc_now
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames

pytestmark = pytest.mark.kafka


def _metric(run: str, step: int) -> MetricEvent:
    return MetricEvent(run=run, role="test", source_id=f"s{step % 3}", timestamp=utc_now(), values={"step": step})


def _publish(config: Config, topic: str, steps: range, partition: int | None = None) -> None:
    with Producer(config.kafka) as producer:
        for step in steps:
            producer.produce(topic, default_serde().encode(_metric(config.run, step)), partition=partition)
        producer.flush()


def _take_until(follower: TopicFollower[MetricEvent], count: int, timeout_s: float = 30.0) -> list[MetricEvent]:
    got: list[MetricEvent] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"got {len(got)} of {count} events"
        got.extend(follower.take(timeout_s=0.5))
    return got


def test_followers_each_read_the_whole_backlog_then_know_they_caught_up_then_see_new_events(
    run_config: Config, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=3)
    _publish(run_config, topic, range(12))
    with (
        TopicFollower(run_config.kafka, topic, MetricEvent, client_id="a") as first,
        TopicFollower(run_config.kafka, topic, MetricEvent, client_id="b") as second,
    ):
        first.start()
        second.start()
        assert first.partitions == [0, 1, 2] and sum(first.end_offsets.values()) == 12
        assert not first.caught_up()
        backlog = _take_until(first, 12)
        assert first.caught_up()
        # No group: a second follower is not handed a share of the partitions, it reads everything too.
        assert sorted(e.values["step"] for e in _take_until(second, 12)) == list(range(12))
        assert sorted(e.values["step"] for e in backlog) == list(range(12))
        _publish(run_config, topic, range(12, 15))
        assert sorted(e.values["step"] for e in _take_until(first, 3)) == [12, 13, 14]


def test_start_resumes_the_given_partitions_at_their_offsets_and_the_rest_from_the_beginning(
    run_config: Config, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=2)
    _publish(run_config, topic, range(5), partition=0)
    _publish(run_config, topic, range(10, 13), partition=1)
    with TopicFollower(run_config.kafka, topic, MetricEvent, client_id="resume") as follower:
        follower.start({0: 3})
        steps = sorted(e.values["step"] for e in _take_until(follower, 5))
        assert steps == [3, 4, 10, 11, 12]
        assert follower.take(timeout_s=1.0) == []


def test_undecodable_records_are_counted_and_dead_lettered_only_when_a_queue_is_given(
    run_config: Config, run_topics: TopicNames, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    with Producer(run_config.kafka) as producer:
        producer.produce(topic, b"not an event")
        producer.produce_event(topic, _metric(run_config.run, 7))
        producer.flush()
        observer = TopicFollower(run_config.kafka, topic, MetricEvent, client_id="observer")
        dead_letters = DeadLetterQueue(run_config.kafka, run_topics.dlq, "owner")
        owner = TopicFollower(run_config.kafka, topic, MetricEvent, client_id="owner", dead_letters=dead_letters)
        for follower in (observer, owner):
            with follower:
                follower.start()
                assert [e.values["step"] for e in _take_until(follower, 1)] == [7]
                assert follower.undecodable == 1
        dead_letters.flush()
    assert dead_letters.count == 1


def test_following_a_missing_topic_is_a_typed_error_naming_it(run_config: Config) -> None:
    with (
        TopicFollower(run_config.kafka, f"{run_config.run}.missing", MetricEvent, client_id="x") as follower,
        pytest.raises(KafkaClientError, match=rf"cannot read {run_config.run}\.missing: "),
    ):
        follower.start(timeout_s=10)
