"""The embedded 3-node cluster: replicated run topics, and a broker SIGKILLed mid-stream without loss or duplicates.

What the test proves is the project's side of Kafka's promise: our producer (idempotent, acks=all) and our group
consumer, on topics created by ``ensure_run_topics`` with replication 3 and ``min.insync.replicas`` 2, lose and
duplicate nothing while the node leading most partitions dies and comes back.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from distrl_stream.config import Config, load_config
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.broker import EmbeddedCluster
from distrl_stream.kafka.consumer import Consumer, read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import ensure_run_topics

pytestmark = pytest.mark.kafka

MESSAGES = 30_000  # three phases: all nodes up, one node dead, the node restarting


def _cluster_config(cluster: EmbeddedCluster, unique_name: Callable[[str], str]) -> Config:
    return load_config(
        None, run=unique_name("run"), kafka={"bootstrap_servers": cluster.bootstrap_servers, "replication_factor": 3}
    )


def test_run_topics_on_the_cluster_have_three_replicas_and_need_two_in_sync(
    kafka_cluster: EmbeddedCluster, unique_name: Callable[[str], str]
) -> None:
    cfg = _cluster_config(kafka_cluster, unique_name)
    admin = Admin(cfg.kafka)
    for topic in ensure_run_topics(cfg, admin).all():
        info = admin.describe_topic(topic)
        assert {p.replicas for p in info.partitions} == {3}, topic
        assert info.config["min.insync.replicas"] == "2", topic
    assert {b for b in admin.client.list_topics(timeout=10).brokers} == {1, 2, 3}


def test_broker_sigkilled_mid_stream_loses_and_duplicates_nothing(
    kafka_cluster: EmbeddedCluster, unique_name: Callable[[str], str]
) -> None:
    cfg = _cluster_config(kafka_cluster, unique_name)
    admin = Admin(cfg.kafka)
    topic = ensure_run_topics(cfg, admin).trajectories
    received: Counter[bytes] = Counter()
    consumer = Consumer(cfg.kafka, group_id=unique_name("group"), client_id="audit")
    consumer.subscribe([topic])

    def consume(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.05):
                received[msg.key()] += 1
                consumer.processed(msg)
            consumer.commit()

    sent: list[bytes] = []
    phase = MESSAGES // 3

    def produce(producer: Producer, n: int) -> None:
        for _ in range(n):
            key = f"episode-{len(sent):06d}".encode()
            producer.produce(topic, key * 8, key=key)
            sent.append(key)
            if len(sent) % 500 == 0:
                producer.poll(0)
                consume(0.0)

    try:
        with Producer(cfg.kafka, client_id="audit") as producer:
            produce(producer, phase)
            producer.flush(60)
            leaders = Counter(p.leader for p in admin.describe_topic(topic).partitions)
            victim = kafka_cluster.node(leaders.most_common(1)[0][0])
            victim.kill()
            produce(producer, phase)  # acks=all with 2 of 3 replicas: writes go on while the node is dead
            producer.flush(120)
            acknowledged_while_down = producer.stats.delivered - phase
            victim.start(wait=False)
            produce(producer, MESSAGES - 2 * phase)
            victim.wait_until_ready()
            stats = producer.flush(120)
        deadline = time.monotonic() + 120
        while len(received) < MESSAGES and time.monotonic() < deadline:
            consume(1.0)
    finally:
        consumer.close()

    on_topic = Counter(msg.key() for msg in read_topic(cfg.kafka, topic, timeout_s=120))
    lost = len(set(sent) - set(on_topic))
    duplicated = sum(n - 1 for n in on_topic.values())
    consumed_twice = sum(n - 1 for n in received.values())
    print(
        f"killed node {victim.run_dir.name}: acknowledged {stats.delivered} ({acknowledged_while_down} while down), "
        f"failed {stats.failed}; on topic {sum(on_topic.values())}, lost {lost}, duplicated {duplicated}; "
        f"consumed {sum(received.values())}, twice {consumed_twice}"
    )
    assert (stats.delivered, stats.failed) == (MESSAGES, 0)
    assert acknowledged_while_down == phase
    assert set(on_topic) == set(sent) and duplicated == 0
    assert set(received) == set(sent) and consumed_twice == 0
