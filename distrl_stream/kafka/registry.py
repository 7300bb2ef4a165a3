"""Schema Registry mode: wire ids from a Confluent-compatible registry instead of ``schemas/ids.json``.

With ``kafka.schema_registry_url`` set, :func:`use_schemas` makes a :class:`RegistrySerde` the process's serde. At a
role's start-up (:func:`~distrl_stream.kafka.topics.ensure_run_topics`) it registers the current schema of every
event under its topic's subject (TopicNameStrategy: ``{topic}-value``), after checking client-side that the schema
can read every version registered there (BACKWARD_TRANSITIVE) and setting the subject's compatibility to that level,
so the registry enforces it against every other writer too. Records keep the Confluent wire format; decoding looks an
unknown id up in the registry once and caches it, so records written by Confluent's own serializers read as well.

Everything goes through Confluent's ``SchemaRegistryClient``: a ``mock://`` URL gives its in-process mock registry,
``http(s)://`` a real one, and nothing else differs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro.schema import parse_schema

from distrl_stream.config import KafkaConfig, mask_secrets
from distrl_stream.errors import EventDecodeError, IncompatibleSchemaError, RegistryError, RegistryUnavailableError
from distrl_stream.events.records import EVENT_TYPES, Event
from distrl_stream.events.serde import HEADER, MAGIC_BYTE, Serde, set_default_serde
from distrl_stream.events.store import SchemaStore, fingerprint

COMPATIBILITY = "BACKWARD_TRANSITIVE"

# The client retries 3 times with backoff up to 20 s by default: a registry that is down would hold start-up for a
# minute. One retry after 0.2-1 s rides out a blip and still fails in seconds.
_CLIENT_RETRIES = {"max.retries": 1, "retries.wait.ms": 200, "retries.max.wait.ms": 1000}

# The client raises its HTTP library's transport errors (httpx2's where installed, as confluent-kafka 2.16 prefers,
# else httpx's) for a registry it cannot reach.
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = tuple(
    importlib.import_module(name).TransportError for name in ("httpx2", "httpx") if importlib.util.find_spec(name)
)
_SUBJECT_NOT_FOUND = 40401

T = TypeVar("T")


def subject_name(topic: str) -> str:
    """The subject of a topic's record values (Confluent's TopicNameStrategy)."""
    return f"{topic}-value"


def check_backward_transitive(subject: str, candidate: str, registered: Sequence[tuple[int, str]]) -> None:
    """Refuse a schema that cannot read data written with every version registered under ``subject``.

    Args:
        subject: the subject, for the error message.
        candidate: the schema to register (JSON text).
        registered: (version, schema JSON text) of every version the subject holds.

    Raises:
        IncompatibleSchemaError: one line naming the subject, the version and what breaks.
    """
    reader = avro.schema.parse(candidate)
    checker = ReaderWriterCompatibilityChecker()
    for version, text in registered:
        result = checker.get_compatibility(reader, avro.schema.parse(text))
        if result.compatibility is not SchemaCompatibilityType.compatible:
            problems = ", ".join(sorted({i.value for i in result.incompatibilities}))
            raise IncompatibleSchemaError(
                subject,
                f"the current {reader.fullname} schema cannot read registered version {version} ({problems}: "
                f"{', '.join(sorted(result.messages))} at {', '.join(sorted(result.locations))}); {COMPATIBILITY} "
                "needs every added field to have a default and no field's type to change (docs/events.md)",
            )


class RegistrySerde(Serde):
    """A serde whose wire ids come from a Schema Registry.

    Writers use the ids :meth:`register` obtained; readers resolve any id through the registry (cached), to the
    current schema of the record it names.

    Args:
        client: Confluent's registry client (``SchemaRegistryClient.new_client``).
        url: the registry's URL, for messages (its credentials masked).
        store: the current schemas (default: the repository's ``schemas/``).
    """

    def __init__(self, client: SchemaRegistryClient, url: str, store: SchemaStore | None = None) -> None:
        super().__init__(store)
        self.client = client
        self.url = mask_secrets(url)
        # Nothing is written or read by static id: ids come from register() and registry lookups.
        self._writers.clear()
        self._readers.clear()

    def register(self, topics: Mapping[type[Event], str]) -> dict[type[Event], int]:
        """Register the current schema of each event type under its topic's subject; returns the ids.

        Raises:
            IncompatibleSchemaError: a schema breaks BACKWARD_TRANSITIVE compatibility with its subject.
            RegistryUnavailableError: the registry did not answer.
            RegistryError: the registry refused a request.
        """
        ids = {}
        for cls, topic in topics.items():
            entry = self.store.latest(cls.AVRO_NAME)
            subject = subject_name(topic)
            check_backward_transitive(subject, entry.schema_str, self._registered(subject))
            self._ask(subject, lambda s=subject: self.client.set_compatibility(s, COMPATIBILITY))
            schema = Schema(entry.schema_str, "AVRO")
            schema_id = self._ask(subject, lambda s=subject, schema=schema: self.client.register_schema(s, schema))
            self._writers[cls] = (HEADER.pack(MAGIC_BYTE, schema_id), entry.parsed)
            self._readers[schema_id] = (cls, entry.parsed, None)
            ids[cls] = schema_id
        return ids

    def _registered(self, subject: str) -> list[tuple[int, str]]:
        """(version, schema text) of every version under ``subject``; none for a new subject."""
        try:
            versions = self.client.get_versions(subject)
        except SchemaRegistryError as exc:
            if exc.error_code == _SUBJECT_NOT_FOUND:
                return []
            raise self._error(subject, exc) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._unreachable(exc) from None
        return [
            (v, self._ask(subject, lambda v=v: self.client.get_version(subject, v).schema.schema_str)) for v in versions
        ]

    def _reader(self, schema_id: int) -> tuple[type[Event], dict[str, Any], dict[str, Any] | None]:
        cached = self._readers.get(schema_id)
        if cached is not None:
            return cached
        try:
            schema = self.client.get_schema(schema_id)  # the client caches schemas by id as well
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise EventDecodeError(
                    "unknown schema id", f"the registry at {self.url} has no such id", schema_id
                ) from None
            raise self._error(f"schema id {schema_id}", exc) from None
        except _TRANSPORT_ERRORS as exc:
            # Not a decode error: the record may be fine, and dead-lettering it would lose it.
            raise self._unreachable(exc) from None
        if schema.schema_type not in (None, "AVRO"):
            raise EventDecodeError("unknown schema id", f"a {schema.schema_type} schema, not Avro", schema_id)
        name = getattr(avro.schema.parse(schema.schema_str), "fullname", None)
        cls = next((c for c in EVENT_TYPES if name == c.AVRO_NAME), None)
        if cls is None:
            raise EventDecodeError("unknown schema id", f"the registry's schema is {name or 'no record'}", schema_id)
        writer = json.loads(schema.schema_str)
        latest = self.store.latest(name)
        same = fingerprint(writer) == latest.fingerprint
        reader = (cls, latest.parsed if same else parse_schema(writer), None if same else latest.parsed)
        self._readers[schema_id] = reader
        return reader

    def _ask(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except SchemaRegistryError as exc:
            raise self._error(what, exc) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._unreachable(exc) from None

    def _error(self, what: str, exc: SchemaRegistryError) -> RegistryError:
        if exc.http_status_code == 409:  # a registry whose check is stricter than Avro's checker
            return IncompatibleSchemaError(what, f"the registry refused the schema: {_one_line(exc.error_message)}")
        return RegistryError(
            f"schema registry at {self.url}: {what}: HTTP {exc.http_status_code} (error {exc.error_code}): "
            f"{_one_line(exc.error_message)}"
        )

    def _unreachable(self, exc: Exception) -> RegistryUnavailableError:
        return RegistryUnavailableError(
            f"schema registry at {self.url} cannot be reached "
            f"({type(exc).__name__}: {mask_secrets(_one_line(str(exc)))}); "
            "check kafka.schema_registry_url, or unset it to use the static ids (offline mode)"
        )


# One serde (and so one client and one id cache) per registry and credentials, for the whole process.
_serdes: dict[tuple[str, str, float], RegistrySerde] = {}


def use_schemas(kafka: KafkaConfig) -> Serde:
    """Make the serde ``kafka`` calls for the process's default, and return it: the static ids without
    ``kafka.schema_registry_url``, otherwise the registry's (one client per registry, so its cache is shared)."""
    url = kafka.schema_registry_url
    if url is None:
        serde = _offline()
    else:
        auth = kafka.schema_registry_basic_auth
        user_info = auth.get_secret_value() if auth is not None else ""
        key = (url, user_info, kafka.schema_registry_timeout_s)
        if key not in _serdes:
            conf: dict[str, Any] = {"url": url, "timeout": kafka.schema_registry_timeout_s, **_CLIENT_RETRIES}
            if user_info:
                conf["basic.auth.user.info"] = user_info
            _serdes[key] = RegistrySerde(SchemaRegistryClient.new_client(conf), url)
        serde = _serdes[key]
    set_default_serde(serde)
    return serde


@cache
def _offline() -> Serde:
    return Serde()


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())
