"""The topic layout of a run: ``{run}.trajectories``, ``{run}.weights``, ``{run}.metrics``, ``{run}.dlq``."""

from __future__ import annotations

from dataclasses import dataclass

from distrl_stream.config import Config, KafkaConfig
from distrl_stream.kafka.admin import Admin, TopicSpec
from distrl_stream.kafka.client import DEAD_LETTER_OVERHEAD_BYTES

TOPIC_KINDS = ("trajectories", "weights", "metrics", "dlq")


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

    def all(self) -> tuple[str, str, str, str]:
        """All four names, in layout order."""
        return (self.trajectories, self.weights, self.metrics, self.dlq)


def run_topic_specs(run: str, kafka: KafkaConfig) -> list[TopicSpec]:
    """The four topics of ``run`` with their configs (partitions, replication and retention from ``kafka``)."""
    names = TopicNames(run)
    rf = kafka.replication_factor
    # With 3+ replicas an acks=all write must reach 2 of them; with fewer, requiring 2 would block on any outage.
    durability = {"min.insync.replicas": "2" if rf >= 3 else "1"}
    keep = str(kafka.trajectory_retention_ms)
    return [
        TopicSpec(
            names.trajectories,
            kafka.trajectory_partitions,
            rf,
            {
                **durability,
                "cleanup.policy": "delete",
                "retention.ms": keep,
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
                "retention.ms": keep,
                "max.message.bytes": str(kafka.max_message_bytes + DEAD_LETTER_OVERHEAD_BYTES),
            },
        ),
    ]


def ensure_run_topics(config: Config, admin: Admin | None = None) -> TopicNames:
    """Create the run's topics where missing (idempotent; existing topics are left as they are)."""
    admin = admin or Admin(config.kafka)
    admin.create_topics(run_topic_specs(config.run, config.kafka), exist_ok=True)
    return TopicNames(config.run)


def delete_run_topics(config: Config, admin: Admin | None = None) -> list[str]:
    """Delete the run's topics; returns those that existed."""
    admin = admin or Admin(config.kafka)
    return admin.delete_topics(list(TopicNames(config.run).all()))
