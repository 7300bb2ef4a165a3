"""Dead-letter path: poison records land in {run}.dlq with their position, bytes and error; good ones keep flowing."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Message, TopicPartition

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
    dead_letters = DeadLetterQueue(run_config.kafka, run_topics.dlq, consumer_name="learner-test")
    try:
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
    finally:
        dead_letters.close()

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


def _poison_messages(run_config: Config, topics: TopicNames, n: int) -> list[Message]:
    """``n`` undecodable records on partition 0 of the trajectories topic, as a reader receives them."""
    with Producer(run_config.kafka) as producer:
        for i in range(n):
            producer.produce(topics.trajectories, f"poison {i}".encode(), key=b"k", partition=0)
        producer.flush()
    return list(read_topic(run_config.kafka, topics.trajectories))


def _dlq_offsets(run_config: Config, topics: TopicNames) -> list[int]:
    return sorted(decode(m.value(), expect=DeadLetter).offset for m in read_topic(run_config.kafka, topics.dlq))


def test_records_read_again_after_a_restart_are_dead_lettered_once(run_config: Config, run_topics: TopicNames) -> None:
    messages = _poison_messages(run_config, run_topics, 3)
    error = EventDecodeError("bad magic byte")
    first = DeadLetterQueue(run_config.kafka, run_topics.dlq, "learner/0")
    with first.batch():
        for msg in messages[:2]:
            assert first.send(msg, error) is not None
    first.close()
    # The restarted reader re-reads everything past its checkpoint: the first two are on the DLQ already.
    again = DeadLetterQueue(run_config.kafka, run_topics.dlq, "learner/0")
    try:
        sent = [again.send(msg, error) for msg in messages]  # each committed (or found) as it is sent
        assert [letter is not None for letter in sent] == [False, False, True]
        assert (again.count, again.duplicates) == (1, 2)
    finally:
        again.close()
    assert _dlq_offsets(run_config, run_topics) == [0, 1, 2]


def test_a_record_every_reader_of_a_shared_topic_sees_is_dead_lettered_once(
    run_config: Config, run_topics: TopicNames
) -> None:
    """Two readers of one record (two policy servers on {run}.weights): the one that takes the partition over
    fences the other, whose open transaction is aborted; its commit then finds the letter there and adds nothing."""
    early, msg, later = _poison_messages(run_config, run_topics, 3)
    error = EventDecodeError("bad magic byte")
    server_a = DeadLetterQueue(run_config.kafka, run_topics.dlq, "inference-watcher-a")
    server_b = DeadLetterQueue(run_config.kafka, run_topics.dlq, "inference-watcher-b")
    try:
        assert server_a.send(early, error) is not None  # A holds the partition's id
        with server_a.batch():
            assert server_a.send(msg, error) is not None  # in A's open transaction, not committed yet
            assert server_b.send(msg, error) is not None  # B fences A (aborting it) and commits its own
        assert server_a.pending == 0 and server_b.pending == 0
        assert (server_a.count, server_a.duplicates) == (1, 1)
        assert server_a.send(later, error) is not None
        assert server_b.send(later, error) is None  # committed by A: B, fenced, takes over and skips it
    finally:
        server_a.close()
        server_b.close()
    letters = [decode(m.value(), expect=DeadLetter) for m in read_topic(run_config.kafka, run_topics.dlq)]
    assert sorted((letter.offset, letter.consumer) for letter in letters) == [
        (0, "inference-watcher-a"),
        (1, "inference-watcher-b"),
        (2, "inference-watcher-a"),
    ]


def test_a_take_over_waits_for_another_partitions_open_transaction_to_see_what_lies_behind_it(
    run_config: Config, run_topics: TopicNames
) -> None:
    """A read_committed reader's watermark stops before the first open transaction: a take-over that stopped there
    would miss its own partition's letters committed behind it, and write them again. Here the open transaction is
    never ended by its writer, so the take-over waits until the coordinator aborts it (the transaction timeout)."""
    with Producer(run_config.kafka) as producer:
        for partition in (0, 0, 1, 1):
            producer.produce(run_topics.trajectories, b"poison", key=b"k", partition=partition)
        producer.flush()
    records = sorted(read_topic(run_config.kafka, run_topics.trajectories), key=lambda m: (m.partition(), m.offset()))
    (p0_first, p0_second), (p1_first, p1_second) = records[:2], records[2:]
    error = EventDecodeError("bad magic byte")
    other = DeadLetterQueue(run_config.kafka, run_topics.dlq, "learner/1")
    first = DeadLetterQueue(run_config.kafka, run_topics.dlq, "learner/0")
    restarted = DeadLetterQueue(run_config.kafka, run_topics.dlq, "learner/0")
    try:
        assert other.send(p1_first, error) is not None and first.send(p0_first, error) is not None  # ids taken
        with other.batch():
            assert other.send(p1_second, error) is not None  # an open transaction on the DLQ
            assert first.send(p0_second, error) is not None  # committed behind it
            assert restarted.send(p0_second, error) is None  # found, once the open transaction is aborted
        # The aborted writer takes its id over again at its commit and sends its letter once more.
        assert other.pending == 0 and (other.count, restarted.duplicates) == (2, 1)
    finally:
        for queue in (other, first, restarted):
            queue.close()
    letters = [decode(m.value(), expect=DeadLetter) for m in read_topic(run_config.kafka, run_topics.dlq)]
    assert sorted((letter.partition, letter.offset, letter.consumer) for letter in letters) == [
        (0, 0, "learner/0"),
        (0, 1, "learner/0"),
        (1, 0, "learner/1"),
        (1, 1, "learner/1"),
    ]
