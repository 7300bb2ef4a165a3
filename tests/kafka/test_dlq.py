"""Dead-letter path: poison records land in {run}.dlq with their position, bytes and error; good ones keep flowing."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition

from distrl_stream.config import Config
from distrl_stream.errors import EventDecodeError, TrajectoryError
from distrl_stream.events import DeadLetter, TrajectoryEvent, decode, encode
from distrl_stream.kafka.consumer import Consumer, EventConsumer, read_topic
from distrl_stream.kafka.dlq import DeadLetterQueue, reason
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.testing.samples import sample_metric, sample_trajectory
from tests.fixtures.kafka import consume

pytestmark = pytest.mark.kafka


def test_poison_records_go_to_the_dlq_and_good_ones_keep_flowing(
    run_config: Config, run_topics: TopicNames, unique_name: Callable[[str], str]
) -> None:
    rng = random.Random(5)
    good = [sample_trajectory(rng, run=run_config.run, steps=2) for _ in range(4)]
    truncated = encode(sample_trajectory(rng, steps=2))[:-7]
    poison = {
        "garbage": b"this is not avro",
        "wrong magic": b"\x01" + encode(good[0])[1:],
        "unknown id": b"\x00" + struct.pack(">I", 99_999) + b"\x02",
        "truncated": truncated,
        "wrong type": encode(sample_metric(rng)),
        "null value": None,
    }
    values = [encode(good[0]), poison["garbage"], encode(good[1]), poison["wrong magic"], poison["unknown id"]]
    values += [encode(good[2]), poison["truncated"], poison["wrong type"], encode(good[3]), poison["null value"]]
    with Producer(run_config.kafka) as producer:
        for value in values:
            producer.produce(run_topics.trajectories, value, key=b"k", partition=0)  # one partition: fixed order
        producer.flush()

    group = unique_name("learner")
    with Producer(run_config.kafka, client_id="dlq") as dlq_producer:
        dead_letters = DeadLetterQueue(dlq_producer, run_topics.dlq, consumer_name="learner-test")
        with Consumer(run_config.kafka, group_id=group) as consumer:
            reader = EventConsumer(consumer, dead_letters, expect=TrajectoryEvent)
            consumer.subscribe([run_topics.trajectories])
            received = consume(reader, 4)
            assert [r.event for r in received] == good
            for r in received:
                reader.processed(r)
            deadline = time.monotonic() + 30
            while dead_letters.count < len(poison):  # the last record is poison: poll until it is handled
                assert reader.poll(0.5) is None
                assert time.monotonic() < deadline, f"only {dead_letters.count} of {len(poison)} dead-lettered"
            reader.commit()
        assert dead_letters.count == len(poison)

    letters = [decode(m.value(), expect=DeadLetter) for m in read_topic(run_config.kafka, run_topics.dlq)]
    offsets = {i: v for i, v in enumerate(values)}
    assert sorted(letter.offset for letter in letters) == [1, 3, 4, 6, 7, 9]
    for letter in letters:
        assert letter.topic == run_topics.trajectories
        assert letter.partition == 0
        assert letter.value == offsets[letter.offset]
        assert letter.key == b"k"
        assert letter.error_class == "EventDecodeError"
        assert letter.consumer == "learner-test"
        assert letter.original_timestamp is not None
    reasons = {letter.offset: letter.error_message for letter in letters}
    assert reasons[1] == "not Avro: text b'this is not avro'"
    assert reasons[3] == "wrong magic byte 0x01 (expected 0x00)"
    assert reasons[4].startswith("unknown schema id 99999: ")
    assert reasons[6].startswith("truncated: ")
    assert reasons[7] == "wrong event type: got MetricEvent, expected TrajectoryEvent"
    assert reasons[9].startswith("not Avro: empty")

    # Everything, the trailing poison record included, was committed: the group resumes after the last record.
    with Consumer(run_config.kafka, group_id=group) as consumer:
        committed = consumer.client.committed([TopicPartition(run_topics.trajectories, 0)], timeout=10)
    assert committed[0].offset == len(values)


@pytest.mark.parametrize(
    ("value", "error", "expected"),
    [
        (b'{"episode_id": "e"}\n', EventDecodeError("bad magic byte"), 'not Avro: text b\'{"episode_id": "e"}\\n\''),
        (b"\x07\x00\x00\x00\x01", EventDecodeError("bad magic byte"), "wrong magic byte 0x07 (expected 0x00)"),
        (b"\x00\x00\x00\x03\xe7", EventDecodeError("unknown schema id", "", 999), "unknown schema id 999"),
        (b"\x00", EventDecodeError("too short", "1 bytes"), "not Avro: too short: 1 bytes"),
        (b"x", TrajectoryError("episode 'e' step 0: negative policy version -1"), "impossible value: episode 'e'"),
        (b"x", ValueError("odd"), "ValueError: odd"),
    ],
)
def test_reason_starts_with_the_category_a_dlq_is_counted_by(value: bytes, error: BaseException, expected: str) -> None:
    assert reason(error, value).startswith(expected)
