"""The per-run topic layout, created on a real broker with the right configs."""

from __future__ import annotations

import pytest

from distrl_stream.config import Config, KafkaConfig
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics, run_topic_specs


def test_topic_names_are_prefixed_by_the_run() -> None:
    names = TopicNames("exp-1")
    assert names.all() == ("exp-1.trajectories", "exp-1.weights", "exp-1.metrics", "exp-1.dlq")


def test_specs_follow_the_kafka_section() -> None:
    cfg = KafkaConfig(trajectory_partitions=6, replication_factor=3)
    specs = {s.name.rpartition(".")[2]: s for s in run_topic_specs("r", cfg)}
    assert specs["trajectories"].partitions == 6
    assert {s.replication_factor for s in specs.values()} == {3}
    assert {s.config["min.insync.replicas"] for s in specs.values()} == {"2"}
    assert specs["metrics"].config["retention.ms"] == str(cfg.metrics_retention_ms)


@pytest.mark.kafka
def test_ensure_run_topics_creates_the_layout_once(run_config: Config, kafka_admin: Admin) -> None:
    try:
        names = ensure_run_topics(run_config, kafka_admin)
        assert ensure_run_topics(run_config, kafka_admin) == names  # idempotent
        topics = kafka_admin.topics()
        assert topics[names.trajectories] == run_config.kafka.trajectory_partitions
        assert topics[names.weights] == topics[names.metrics] == topics[names.dlq] == 1
        assert kafka_admin.describe_topic(names.weights).config["cleanup.policy"] == "compact"
        metrics = kafka_admin.describe_topic(names.metrics).config
        assert (metrics["cleanup.policy"], metrics["retention.ms"]) == ("delete", str(7 * 24 * 3600 * 1000))
        trajectories = kafka_admin.describe_topic(names.trajectories).config
        assert trajectories["retention.ms"] == "-1"
        assert trajectories["max.message.bytes"] == str(run_config.kafka.max_message_bytes)
    finally:
        assert sorted(delete_run_topics(run_config, kafka_admin)) == sorted(TopicNames(run_config.run).all())
    assert not set(TopicNames(run_config.run).all()) & set(kafka_admin.topics())
