"""Kafka for distrl-stream: the embedded broker, thin typed clients with safe defaults, and the run's topic layout.

- :mod:`.broker` / :mod:`.install`: run a single-node KRaft broker from an Apache Kafka installation.
- :mod:`.producer`, :mod:`.consumer`, :mod:`.admin`: wrappers over confluent-kafka; every property of
  ``Config.kafka.client`` reaches every client. :mod:`.follower`: ``TopicFollower`` reads a whole topic outside any
  group.
- Only this package imports confluent-kafka: the record and error types callbacks receive (``Message``,
  ``KafkaError``, ``TopicPartition``) are re-exported here for type hints.
- :mod:`.topics`: ``TopicNames(run)`` and the topic configs; :mod:`.dlq`: the dead-letter queue.
- :mod:`.registry`: Schema Registry mode (``kafka.schema_registry_url``): ``use_schemas`` picks the process's serde,
  ``RegistrySerde`` registers the run's schemas and resolves ids through Confluent's registry client.
"""

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from distrl_stream.kafka.admin import Admin, TopicInfo, TopicSpec
from distrl_stream.kafka.consumer import Consumer, EventConsumer, Received, read_topic
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.producer import DeliveryStats, Producer
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics, run_topic_specs

__all__ = [
    "OFFSET_BEGINNING",
    "Admin",
    "Consumer",
    "DeadLetterQueue",
    "DeliveryStats",
    "EventConsumer",
    "KafkaError",
    "Message",
    "Producer",
    "Received",
    "TopicFollower",
    "TopicInfo",
    "TopicNames",
    "TopicPartition",
    "TopicSpec",
    "delete_run_topics",
    "ensure_run_topics",
    "read_topic",
    "run_topic_specs",
]
