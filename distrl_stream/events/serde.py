"""Confluent wire format for events: byte 0 = 0, bytes 1-4 = big-endian schema id, then Avro binary (fastavro).

Writers always use the current schema of the event's record. Readers look the writer schema up by id and resolve it
to the current schema of the same record (Avro schema resolution), so data written by an older version reads with
the newer one as long as every added field has a default (BACKWARD compatibility).
"""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any, TypeVar, overload

from fastavro import schemaless_reader, schemaless_writer

from distrl_stream.errors import EventDecodeError, EventEncodeError
from distrl_stream.events.records import EVENT_TYPES, Event
from distrl_stream.events.store import SchemaEntry, SchemaStore, default_store

MAGIC_BYTE = 0
# Confluent framing: the magic byte, then the big-endian schema id.
HEADER = struct.Struct(">BI")

E = TypeVar("E", bound=Event)


class Serde:
    """Encodes and decodes events against one schema store (default: the repository's ``schemas/``)."""

    def __init__(self, store: SchemaStore | None = None) -> None:
        self.store = store or default_store()
        self._writers: dict[type, tuple[bytes, dict[str, Any]]] = {}
        # Per writer id: the event class, the writer's parsed schema and the reader's (None: same as the writer).
        self._readers: dict[int, tuple[type[Event], dict[str, Any], dict[str, Any] | None]] = {}
        for cls in EVENT_TYPES:
            latest = self.store.latest(cls.AVRO_NAME)
            self._writers[cls] = (HEADER.pack(MAGIC_BYTE, latest.id), latest.parsed)
        for entry in self.store:
            cls = next((c for c in EVENT_TYPES if entry.name == c.AVRO_NAME), None)
            if cls is not None:
                reader = self.store.latest(entry.name)
                self._readers[entry.id] = (cls, entry.parsed, None if reader.id == entry.id else reader.parsed)

    def schema_id(self, event_type: type[Event]) -> int:
        """The id this serde writes ``event_type`` with."""
        return HEADER.unpack(self._writers[event_type][0])[1]

    def writer_schema(self, event_type: type[Event]) -> SchemaEntry:
        """The schema version this serde writes ``event_type`` with."""
        return self.store.latest(event_type.AVRO_NAME)

    def encode(self, event: Event) -> bytes:
        """Serialize an event to the Confluent wire format.

        Raises:
            EventEncodeError: the value is not an event, or a field does not fit its Avro type.
        """
        try:
            header, schema = self._writers[type(event)]
        except KeyError:
            if type(event) in EVENT_TYPES:
                raise EventEncodeError(
                    f"{type(event).__name__}: no schema id to write it with (register the run's schemas first: "
                    "ensure_run_topics)"
                ) from None
            raise EventEncodeError(f"not an event: {type(event).__name__}") from None
        out = BytesIO()
        out.write(header)
        try:
            schemaless_writer(out, schema, event.to_avro())
        except Exception as exc:  # fastavro raises TypeError, ValueError, AttributeError... for a bad field
            raise EventEncodeError(f"{type(event).__name__}: {type(exc).__name__}: {exc}") from exc
        return out.getvalue()

    @overload
    def decode(self, data: bytes | None, expect: type[E]) -> E: ...
    @overload
    def decode(self, data: bytes | None, expect: None = None) -> Event: ...
    def decode(self, data: bytes | None, expect: type[E] | None = None) -> Event:
        """Deserialize wire bytes into the event type named by their schema id.

        Args:
            data: a message value.
            expect: if given, the event type the caller can handle; anything else is an error.

        Raises:
            EventDecodeError: empty or short input, a wrong magic byte, an unknown schema id, a truncated or
                malformed body, bytes left over after the record, or (with ``expect``) another event type.
        """
        if not data:
            raise EventDecodeError("empty", "no bytes (a null or empty message value)")
        if len(data) < HEADER.size:
            raise EventDecodeError("too short", f"{len(data)} bytes, the header alone is {HEADER.size}")
        magic, schema_id = HEADER.unpack_from(data)
        if magic != MAGIC_BYTE:
            raise EventDecodeError("bad magic byte", f"byte 0 is {data[0]:#04x}, expected 0x00 (Confluent framing)")
        cls, writer, reader = self._reader(schema_id)
        if expect is not None and cls is not expect:
            raise EventDecodeError("unexpected type", f"got {cls.__name__}, expected {expect.__name__}", schema_id)
        body = BytesIO(data)
        body.seek(HEADER.size)
        try:
            record = schemaless_reader(body, writer, reader)
        except EOFError:
            raise EventDecodeError("truncated", f"{len(data)} bytes end inside the {cls.__name__}", schema_id) from None
        except Exception as exc:  # fastavro raises many types on corrupt input (UnicodeDecodeError, IndexError, ...)
            raise EventDecodeError("malformed", f"{type(exc).__name__}: {exc}", schema_id) from None
        if body.tell() != len(data):
            raise EventDecodeError(
                "trailing bytes", f"{len(data) - body.tell()} bytes after the {cls.__name__} record", schema_id
            )
        try:
            return cls.from_avro(record)
        except (TypeError, ValueError) as exc:
            raise EventDecodeError("malformed", f"{type(exc).__name__}: {exc}", schema_id) from None

    def _reader(self, schema_id: int) -> tuple[type[Event], dict[str, Any], dict[str, Any] | None]:
        """The event class, writer schema and reader schema (None: the writer's) of a wire id."""
        try:
            return self._readers[schema_id]
        except KeyError:
            known = ", ".join(str(i) for i in sorted(self._readers))
            raise EventDecodeError(
                "unknown schema id", f"this build knows ids {known}; upgrade it or check the producer", schema_id
            ) from None


_default: Serde | None = None


def default_serde() -> Serde:
    """The process-wide serde: the static ids of the repository's schema store, unless a role's start-up installed
    a registry-backed one (:func:`~distrl_stream.kafka.registry.use_schemas`)."""
    global _default
    if _default is None:
        _default = Serde()
    return _default


def set_default_serde(serde: Serde) -> None:
    """Make ``serde`` the process-wide serde that :func:`encode`, :func:`decode` and the Kafka wrappers use."""
    global _default
    _default = serde


def encode(event: Event) -> bytes:
    """Serialize an event with the default serde (see :meth:`Serde.encode`)."""
    return default_serde().encode(event)


@overload
def decode(data: bytes | None, expect: type[E]) -> E: ...
@overload
def decode(data: bytes | None, expect: None = None) -> Event: ...
def decode(data: bytes | None, expect: type[E] | None = None) -> Event:
    """Deserialize wire bytes with the default serde (see :meth:`Serde.decode`)."""
    return default_serde().decode(data, expect)
