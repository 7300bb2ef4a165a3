"""Avro events on the wire: typed records, the schema store, and the Confluent-format serde.

The API the roles call::

    from distrl_stream.events import TrajectoryEvent, encode, decode

    data = encode(event)                       # bytes: 0x00, schema id (4 bytes, big-endian), Avro body
    event = decode(data)                       # the record type named by the schema id
    event = decode(data, expect=TrajectoryEvent)  # or EventDecodeError("unexpected type")
"""

from distrl_stream.events.records import (
    EVENT_TYPES,
    DeadLetter,
    Event,
    MetricEvent,
    Step,
    Tensor,
    Termination,
    TrajectoryEvent,
    WeightVersionEvent,
    epoch_ms,
    event_key,
    from_epoch_ms,
    utc_now,
)
from distrl_stream.events.serde import Serde, decode, default_serde, encode
from distrl_stream.events.store import SchemaEntry, SchemaStore, default_store

__all__ = [
    "EVENT_TYPES",
    "DeadLetter",
    "Event",
    "MetricEvent",
    "SchemaEntry",
    "SchemaStore",
    "Serde",
    "Step",
    "Tensor",
    "Termination",
    "TrajectoryEvent",
    "WeightVersionEvent",
    "decode",
    "default_serde",
    "default_store",
    "encode",
    "epoch_ms",
    "event_key",
    "from_epoch_ms",
    "utc_now",
]
