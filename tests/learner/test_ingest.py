"""Garbage at volume: 10,000 bad records of every kind injected into ``{run}.trajectories`` while the learner trains.

Every bad record lands in ``{run}.dlq`` byte for byte with its reason's category, the learner keeps updating, and
every good episode is ingested exactly once. "Oversized" here means a record just under the topic's
``max.message.bytes`` (the largest thing a consumer can meet: the broker refuses anything bigger at produce time):
its dead letter must still fit the DLQ, which allows ``DEAD_LETTER_OVERHEAD_BYTES`` more.
"""

from __future__ import annotations

import dataclasses
import random
import re
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from distrl_stream.config import Config
from distrl_stream.events import DeadLetter, Tensor, TrajectoryEvent, decode, encode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.learner.checkpoint import IngestLog
from distrl_stream.learner.role import Learner
from distrl_stream.testing.samples import sample_metric
from tests.learner.simdata import sim_events

pytestmark = pytest.mark.kafka
torch.set_num_threads(1)

BAD = 10_000
GOOD = 24
MAX_MESSAGE_BYTES = 100_000
OVERSIZED = 10  # ~100 KB each: a few are enough to prove the DLQ takes them


def _with_step(event: TrajectoryEvent, **changes: object) -> bytes:
    step = dataclasses.replace(event.steps[0], **changes)
    return encode(dataclasses.replace(event, steps=[step, *event.steps[1:]]))


def bad_records(template: TrajectoryEvent, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """(category its reason must start with, value) for ``BAD`` records, kinds in turn."""
    good = encode(template)
    impossible = [
        _with_step(template, reward=float("nan")),
        _with_step(template, policy_version=-1),
        _with_step(template, token_logprobs=Tensor.from_numpy(np.zeros(99, dtype=np.float32))),
        _with_step(template, token_ids=Tensor(data=b"\x01\x02\x03", dtype="int32", shape=(5,))),
    ]
    kinds: list[Callable[[int], tuple[str, bytes]]] = [
        lambda i: ("not Avro", f'{{"episode_id": "json-{i}", "reward": 1.0}}'.encode()),
        lambda i: ("wrong magic byte", bytes([1 + i % 255]) + good[1:]),
        lambda i: ("unknown schema id", b"\x00" + struct.pack(">I", 999 + i % 7) + good[5:]),
        lambda i: ("truncated", good[: -1 - i % 8]),  # cut inside the last step's latencies
        lambda i: ("wrong event type", encode(sample_metric(rng))),
        lambda i: ("impossible value", impossible[i % len(impossible)]),
    ]
    oversized = good + bytes(MAX_MESSAGE_BYTES - 1024 - len(good))
    for i in range(BAD - OVERSIZED):
        yield kinds[i % len(kinds)](i)
    for _ in range(OVERSIZED):
        yield "not Avro", oversized  # "trailing bytes" after a valid trajectory


def test_ten_thousand_bad_records_are_dead_lettered_while_the_learner_trains_on_the_good_ones(
    make_config: Callable[..., Config], tiny_model_dir: Path
) -> None:
    cfg = make_config(
        model={"base": tiny_model_dir},
        kafka={"max_message_bytes": MAX_MESSAGE_BYTES},
        artifacts={"chunk_bytes": MAX_MESSAGE_BYTES // 2},  # adapter chunks must fit the smaller message limit
        learner={
            "batch_episodes": 2,
            "min_buffer_episodes": 2,
            "updates_per_version": 100_000,  # no publishing: this test is about ingest
            "checkpoint_interval_updates": 100_000,
            "priority_refresh_interval": 100_000,
            "metrics_interval_s": 1.0,
        },
    )
    topics = TopicNames(cfg.run)
    learner = Learner(cfg)
    learner.start()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            learner.run(stop)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert not failure and thread.is_alive(), f"the learner stopped: {failure}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    good = sim_events(learner.trainer.tokenizer, GOOD, seed=3, run=cfg.run)
    bad = list(bad_records(good[0], random.Random(7)))
    try:
        with Producer(cfg.kafka, client_id="garbage") as producer:
            for event in good[:4]:
                producer.produce(topics.trajectories, encode(event), key=event.episode_id)
            producer.flush()
            wait_for("the first update", lambda: learner.trainer.updates > 0, 120)
            updates_before = learner.trainer.updates
            started = time.monotonic()
            # The rest of the good episodes spread evenly through the garbage.
            every = len(bad) // (GOOD - 4)
            for i, (_category, value) in enumerate(bad):
                producer.produce(topics.trajectories, value, key=f"bad-{i}")
                if i % every == 0 and 4 + i // every < GOOD:
                    event = good[4 + i // every]
                    producer.produce(topics.trajectories, encode(event), key=event.episode_id)
            stats = producer.flush()
            produced_in = time.monotonic() - started
        assert stats.failed == 0 and stats.delivered == BAD + GOOD
        wait_for("every record", lambda: learner.counters.dead + learner.counters.ingested >= BAD + GOOD, 300)
        consumed_in = time.monotonic() - started
        wait_for("an update after the garbage", lambda: learner.trainer.updates > updates_before + 2, 120)
    finally:
        stop.set()
        thread.join(60)
        learner.close()
    assert not failure, failure

    letters = [decode(m.value(), DeadLetter) for m in read_topic(cfg.kafka, topics.dlq, timeout_s=120)]
    by_key = {letter.key: letter for letter in letters}
    assert len(letters) == len(by_key) == BAD  # each bad record once, nothing else
    by_category: Counter[str] = Counter()
    for i, (category, value) in enumerate(bad):
        letter = by_key[f"bad-{i}".encode()]
        assert letter.value == value and letter.topic == topics.trajectories
        assert letter.error_message.startswith(category), (category, letter.error_message)
        by_category[category] += 1
    reasons = Counter(re.split(r":| \d| 0x", letter.error_message)[0] for letter in letters)
    print(
        f"{BAD} bad + {GOOD} good produced in {produced_in:.1f} s, consumed by the learner in {consumed_in:.1f} s; "
        f"updates {updates_before} before the garbage, {learner.trainer.updates} at the end; DLQ by reason {reasons}"
    )

    records = IngestLog.read(learner.ingest_log.path)
    ingested = Counter(r.episode_id for r in records if r.status == "ingested")
    assert ingested == Counter(e.episode_id for e in good)  # every good episode, each once
    assert Counter(r.status for r in records) == {"ingested": GOOD, "dead": BAD}
    assert learner.counters.dead == BAD and learner.trainer.updates > updates_before + 2
