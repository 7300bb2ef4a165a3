"""What every Kafka client shares: how its librdkafka configuration is assembled, and where its logs go."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import KafkaClientError

# librdkafka logs to stderr by default, over a CLI's or dashboard's output; route it through logging instead.
LIBRDKAFKA_LOGGER = logging.getLogger("distrl_stream.kafka.librdkafka")

# Room a DeadLetter needs beyond the record it wraps (the DLQ topic and producers allow this much more).
DEAD_LETTER_OVERHEAD_BYTES = 64 * 1024


def client_config(
    kafka: KafkaConfig, defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The librdkafka configuration of one client.

    Precedence, lowest first: the wrapper's ``defaults``, every property of ``kafka.client`` (so a user's
    ``security.protocol``, ``sasl.*``, ``ssl.*``... reach every producer, consumer and admin client), then the
    caller's ``overrides``.
    """
    conf: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers, "logger": LIBRDKAFKA_LOGGER}
    conf.update(defaults)
    conf.update(kafka.client_properties())
    if overrides:
        conf.update(overrides)
    return conf


def build_client(factory: Any, conf: dict[str, Any], what: str) -> Any:
    """Construct a confluent-kafka client, turning librdkafka's rejection of the configuration into a typed error."""
    try:
        return factory(conf)
    except (KafkaException, ValueError, TypeError) as exc:
        raise KafkaClientError(f"invalid {what} configuration: {_message(exc)}") from None


def _message(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args:
        return exc.args[0].str()
    return str(exc)
