"""The compacted weights topic: a late reader sees every policy's latest version; old versions get compacted away."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from distrl_stream.config import Config
from distrl_stream.events import WeightVersionEvent, decode, epoch_ms, utc_now
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, run_topic_specs
from distrl_stream.testing.samples import sample_weight_version

pytestmark = pytest.mark.kafka


def _latest_by_policy(config: Config, topic: str) -> tuple[dict[str, int], int]:
    latest: dict[str, int] = {}
    count = 0
    for msg in read_topic(config.kafka, topic):
        event = decode(msg.value(), expect=WeightVersionEvent)
        assert msg.key() == event.policy_id.encode()
        latest[event.policy_id] = event.version
        count += 1
    return latest, count


def test_weights_topic_is_created_compacted(run_topics: TopicNames, kafka_admin: Admin) -> None:
    info = kafka_admin.describe_topic(run_topics.weights)
    assert info.config["cleanup.policy"] == "compact"
    assert len(info.partitions) == 1


def test_late_reader_sees_the_latest_version_of_every_policy(run_config: Config, run_topics: TopicNames) -> None:
    rng = random.Random(0)
    with Producer(run_config.kafka) as producer:
        for version in range(1, 6):
            producer.produce_event(run_topics.weights, sample_weight_version(rng, policy_id="pi", version=version))
            if version <= 3:
                producer.produce_event(run_topics.weights, sample_weight_version(rng, policy_id="mu", version=version))
        producer.flush()
    latest, _ = _latest_by_policy(run_config, run_topics.weights)
    assert latest == {"pi": 5, "mu": 3}


def test_compaction_removes_superseded_versions(run_config: Config, kafka_admin: Admin) -> None:
    spec = next(s for s in run_topic_specs(run_config.run, run_config.kafka) if s.name.endswith(".weights"))
    # Production layout, with segments that roll at every record and a cleaner that does not wait for dirt.
    fast = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}
    kafka_admin.create_topics([dataclasses.replace(spec, config={**spec.config, **fast})])
    rng = random.Random(1)
    base = epoch_ms(utc_now()) - 60_000
    writes = [("pi", v) for v in range(1, 6)] + [("mu", v) for v in range(1, 4)] + [("tail", 1)]
    try:
        with Producer(run_config.kafka) as producer:
            for i, (policy, version) in enumerate(writes):
                # Record timestamps 1 s apart roll a new segment per record (segment.ms uses record time); the
                # "tail" record keeps the active segment, which the cleaner never touches, free of the others.
                event = sample_weight_version(rng, policy_id=policy, version=version)
                producer.produce_event(spec.name, event, timestamp_ms=base + i * 1000)
                producer.flush()
        deadline = time.monotonic() + 45
        latest, count = _latest_by_policy(run_config, spec.name)
        while count > 3 and time.monotonic() < deadline:
            latest, count = _latest_by_policy(run_config, spec.name)
        assert latest == {"pi": 5, "mu": 3, "tail": 1}
        assert count == 3, f"{count} records left; expected only the 3 latest after compaction"
    finally:
        kafka_admin.delete_topics([spec.name])
