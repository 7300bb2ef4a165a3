"""The topic layout of a run: ``{run}.trajectories``, ``{run}.weights``, ``{run}.artifacts``, ``{run}.metrics``,
``{run}.dlq``."""

from __future__ import annotations

from dataclasses import dataclass

from distrl_stream.config import Config, KafkaConfig
from distrl_stream.events import EVENT_TYPES, DeadLetter, Event, MetricEvent, TrajectoryEvent, WeightVersionEvent
from distrl_stream.kafka.admin import Admin, TopicSpec
from distrl_stream.kafka.client import DEAD_LETTER_OVERHEAD_BYTES
from distrl_stream.kafka.registry import RegistrySerde, use_schemas

TOPIC_KINDS = ("trajectories", "weights", "artifacts", "metrics", "dlq")


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The names of a run's topics; the run prefix keeps runs from ever mixing on one cluster."""

    run: str

    @property
    def trajectories(self) -> str:
        """TrajectoryEvents keyed by episode id; the learner group consumes it."""
        return f"{self.run}.trajectories"

    @property
    def weights(self) -> str:
        """WeightVersionEvents keyed by policy id; compacted, so reading it from the start gives the latest."""
        return f"{self.run}.weights"

    @property
    def artifacts(self) -> str:
        """Adapter folders in chunks (raw bytes + headers), keyed by policy, slot and chunk; compacted, so the
        newest ``artifacts.keep_versions`` versions of each policy stay readable (``distrl_stream.artifacts``)."""
        return f"{self.run}.artifacts"

    @property
    def metrics(self) -> str:
        """MetricEvents of every role; time-based retention."""
        return f"{self.run}.metrics"

    @property
    def dlq(self) -> str:
        """DeadLetters: records some consumer could not use."""
        return f"{self.run}.dlq"

    @property
    def learner_group(self) -> str:
        """The learners' consumer group on the trajectories; the monitor reads its lag."""
        return f"{self.run}.learner"

    def all(self) -> tuple[str, str, str, str, str]:
        """All five names, in layout order."""
        return (self.trajectories, self.weights, self.artifacts, self.metrics, self.dlq)

    def of(self, event_type: type[Event]) -> str:
        """The topic that carries ``event_type`` (its values' schema subject is ``{topic}-value``)."""
        return {
            TrajectoryEvent: self.trajectories,
            WeightVersionEvent: self.weights,
            MetricEvent: self.metrics,
            DeadLetter: self.dlq,
        }[event_type]


def run_topic_specs(run: str, kafka: KafkaConfig) -> list[TopicSpec]:
    """The five topics of ``run`` with their configs (partitions, replication and retention from ``kafka``).

    Retention: trajectories are kept (-1) because they are the replay log; metrics for days, dead letters for weeks
    (``kafka.*_retention_ms``); weights are compacted, so each policy's latest version stays forever; artifacts are
    compacted by (policy, slot, chunk) key, so each policy's newest ``artifacts.keep_versions`` versions stay.
    """
    names = TopicNames(run)
    rf = kafka.replication_factor
    # With 3+ replicas an acks=all write must reach 2 of them; with fewer, requiring 2 would block on any outage.
    durability = {"min.insync.replicas": "2" if rf >= 3 else "1"}
    return [
        TopicSpec(
            names.trajectories,
            kafka.trajectory_partitions,
            rf,
            {
                **durability,
                "cleanup.policy": "delete",
                "retention.ms": str(kafka.trajectory_retention_ms),
                "max.message.bytes": str(kafka.max_message_bytes),
            },
        ),
        TopicSpec(
            # One partition: versions of a policy stay in order for every reader.
            names.weights,
            1,
            rf,
            {
                **durability,
                # Compacted by policy id: a late reader gets each policy's latest version without the history.
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                # Roll hourly so the cleaner (which skips the active segment) actually compacts during a run.
                "segment.ms": str(3600 * 1000),
            },
        ),
        TopicSpec(
            # One partition: a version's chunks are one contiguous offset range, which its kafka:// URI names.
            names.artifacts,
            1,
            rf,
            {
                **durability,
                # Version v reuses the keys of version v - keep_versions: compaction removes the older one.
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                "segment.ms": str(3600 * 1000),
                "max.message.bytes": str(kafka.max_message_bytes),
            },
        ),
        TopicSpec(
            names.metrics,
            1,
            rf,
            {**durability, "cleanup.policy": "delete", "retention.ms": str(kafka.metrics_retention_ms)},
        ),
        TopicSpec(
            names.dlq,
            1,
            rf,
            {
                **durability,
                "cleanup.policy": "delete",
                "retention.ms": str(kafka.dlq_retention_ms),
                "max.message.bytes": str(kafka.max_message_bytes + DEAD_LETTER_OVERHEAD_BYTES),
            },
        ),
    ]


def ensure_run_topics(config: Config, admin: Admin | None = None) -> TopicNames:
    """Set up the run's events at a role's start: the schemas, then the topics where missing (both idempotent;
    existing topics are left as they are).

    Makes the process's serde the one ``config.kafka`` calls for; with a Schema Registry, first registers every
    event's schema under its topic's subject, so an incompatible schema or an unreachable registry stops the role
    here, before it creates or writes anything.

    Raises:
        IncompatibleSchemaError: a schema breaks its subject's BACKWARD_TRANSITIVE compatibility.
        RegistryError: the registry could not be reached or refused a request.
        KafkaClientError: the cluster refused a topic or did not answer.
    """
    names = TopicNames(config.run)
    serde = use_schemas(config.kafka)
    if isinstance(serde, RegistrySerde):
        serde.register({cls: names.of(cls) for cls in EVENT_TYPES})
    admin = admin or Admin(config.kafka)
    admin.create_topics(run_topic_specs(config.run, config.kafka), exist_ok=True)
    return names


def delete_run_topics(config: Config, admin: Admin | None = None) -> list[str]:
    """Delete the run's topics; returns those that existed."""
    admin = admin or Admin(config.kafka)
    return admin.delete_topics(list(TopicNames(config.run).all()))
