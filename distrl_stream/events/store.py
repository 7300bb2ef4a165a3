"""The schema store: which Avro schema each wire id names, loaded from ``schemas/``.

Layout of the schema folder:

- ``<Name>.avsc``: the current version of each record, one record per file; records refer to each other by full name
  (``distrl.Step``).
- ``history/<Name>.v<N>.avsc``: older versions of top-level events, self-contained, kept so that records written with
  them stay readable.
- ``ids.json``: the wire ids. Each entry names a record, its version, the file holding it and the SHA-256 of its
  Parsing Canonical Form. Ids are assigned once and never change or get reused; the fingerprint check makes an edit
  to a published schema fail loudly at load time instead of silently mis-decoding old data.

Because the ids live in a committed file, every process on every machine agrees on them without a registry. A real
Confluent Schema Registry can hold the same schemas under the same ids (register them in id order on an empty
registry, or in IMPORT mode), so its deserializers read what we write.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastavro.schema import parse_schema, to_parsing_canonical_form

from distrl_stream.errors import SchemaStoreError

MANIFEST = "ids.json"
# The repository's schemas/ folder, installed as the package distrl_stream.schemas (pyproject's package-dir).
DEFAULT_SCHEMA_DIR = Path(str(files("distrl_stream.schemas")))

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


@dataclass(frozen=True, slots=True)
class SchemaEntry:
    """One registered schema version.

    Attributes:
        id: the wire id (bytes 1-4 of every message written with this schema).
        name: full record name, e.g. ``distrl.TrajectoryEvent``.
        version: 1, 2, ... per name.
        path: the .avsc file it came from.
        schema: the self-contained schema (named types inlined at first use) as JSON-ready data.
        parsed: the fastavro parsed schema, for ``schemaless_writer``/``schemaless_reader``.
        fingerprint: hex SHA-256 of the Parsing Canonical Form.
    """

    id: int
    name: str
    version: int
    path: Path
    schema: dict[str, Any]
    parsed: dict[str, Any]
    fingerprint: str

    @property
    def schema_str(self) -> str:
        """The self-contained schema as JSON text (what a Schema Registry would hold)."""
        return json.dumps(self.schema, separators=(",", ":"))


class SchemaStore:
    """All schema versions of a schema folder, by id, with the current (writer) version of every record."""

    def __init__(self, entries: list[SchemaEntry]) -> None:
        self._by_id = {e.id: e for e in entries}
        self._latest: dict[str, SchemaEntry] = {}
        for entry in sorted(entries, key=lambda e: e.version):
            self._latest[entry.name] = entry

    @classmethod
    def load(cls, directory: Path | None = None) -> SchemaStore:
        """Load and verify a schema folder (default: the ``schemas/`` shipped in the package).

        Raises:
            SchemaStoreError: a file is missing or unparsable, an id or version is duplicated, or a schema no longer
                matches the fingerprint recorded for its id.
        """
        directory = directory or DEFAULT_SCHEMA_DIR
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise SchemaStoreError(f"no schema manifest at {manifest_path}: is {directory} the schemas/ folder?")
        raw_types = _load_named_types(directory)
        manifest = _read_json(manifest_path)
        entries: list[SchemaEntry] = []
        seen_versions: set[tuple[str, int]] = set()
        for item in manifest.get("schemas", []):
            try:
                schema_id, name, version, rel = int(item["id"]), item["name"], int(item["version"]), item["file"]
                recorded = item["fingerprint"]
            except (KeyError, TypeError, ValueError) as exc:
                raise SchemaStoreError(f"{manifest_path}: malformed entry {item!r} ({exc})") from None
            if any(e.id == schema_id for e in entries) or (name, version) in seen_versions:
                raise SchemaStoreError(f"{manifest_path}: duplicate id {schema_id} or {name} version {version}")
            seen_versions.add((name, version))
            path = directory / rel
            if path.parent == directory:
                # A current file: inline the named types it refers to from the other current files.
                if name not in raw_types:
                    raise SchemaStoreError(f"{manifest_path}: id {schema_id} names {name}, defined in no .avsc file")
                schema = self_contained(raw_types[name], raw_types)
            else:
                schema = _read_json(path)
            entries.append(_entry(schema_id, name, version, path, schema, recorded))
        if not entries:
            raise SchemaStoreError(f"{manifest_path} lists no schemas")
        return cls(entries)

    def by_id(self, schema_id: int) -> SchemaEntry | None:
        """The schema version written under ``schema_id``, or None when this build does not know it."""
        return self._by_id.get(schema_id)

    def latest(self, name: str) -> SchemaEntry:
        """The current version of record ``name`` (what writers use and readers resolve to)."""
        try:
            return self._latest[name]
        except KeyError:
            raise SchemaStoreError(f"no schema for record {name}; known: {sorted(self._latest)}") from None

    def __iter__(self) -> Iterator[SchemaEntry]:
        return iter(sorted(self._by_id.values(), key=lambda e: e.id))


@cache
def default_store() -> SchemaStore:
    """The store of the ``schemas/`` shipped in the package, loaded once per process."""
    return SchemaStore.load()


def fingerprint(schema: dict[str, Any]) -> str:
    """Hex SHA-256 of a schema's Parsing Canonical Form (the Avro spec's normalisation: no docs, no defaults)."""
    return hashlib.sha256(to_parsing_canonical_form(schema).encode()).hexdigest()


def self_contained(schema: Any, named: dict[str, dict[str, Any]], _defined: set[str] | None = None) -> Any:
    """Inline, at first use, every named type ``schema`` refers to, so the result parses on its own.

    Args:
        schema: a schema (dict, list for unions, or a type name).
        named: raw definitions of named types by full name.
    """
    defined = set() if _defined is None else _defined
    if isinstance(schema, str):
        if schema in _PRIMITIVES or schema in defined:
            return schema
        if schema not in named:
            raise SchemaStoreError(f"unknown Avro type {schema!r}")
        return self_contained(copy.deepcopy(named[schema]), named, defined)
    if isinstance(schema, list):
        return [self_contained(branch, named, defined) for branch in schema]
    out = dict(schema)
    kind = out.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        defined.add(_full_name(out))
    if kind in ("record", "error"):
        out["fields"] = [{**f, "type": self_contained(f["type"], named, defined)} for f in out["fields"]]
    elif kind == "array":
        out["items"] = self_contained(out["items"], named, defined)
    elif kind == "map":
        out["values"] = self_contained(out["values"], named, defined)
    elif kind not in ("enum", "fixed"):
        # {"type": <schema>} wraps another schema: a primitive (maybe with a logicalType), a reference or a union.
        out["type"] = self_contained(kind, named, defined)
    return out


def _entry(schema_id: int, name: str, version: int, path: Path, schema: dict[str, Any], recorded: str) -> SchemaEntry:
    if _full_name(schema) != name:
        raise SchemaStoreError(f"{path} defines {_full_name(schema)}, but ids.json says id {schema_id} is {name}")
    try:
        parsed = parse_schema(schema, _write_hint=True)
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise SchemaStoreError(f"{path}: not a valid Avro schema: {exc}") from None
    actual = fingerprint(schema)
    if actual != recorded:
        raise SchemaStoreError(
            f"{path} no longer matches schema id {schema_id} ({name} v{version}): fingerprint {actual} != recorded "
            f"{recorded}. Published schemas never change: keep the old version in schemas/history/ and give the new "
            "one a new id (docs/events.md, 'Evolving a schema')."
        )
    return SchemaEntry(schema_id, name, version, path, schema, parsed, actual)


def _load_named_types(directory: Path) -> dict[str, dict[str, Any]]:
    """Raw definitions of the current records (and the named types defined inside them) by full name."""
    named: dict[str, dict[str, Any]] = {}

    def collect(schema: Any, namespace: str | None) -> None:
        if isinstance(schema, list):
            for branch in schema:
                collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "error", "enum", "fixed"):
                name = _full_name(schema, namespace)
                if name in named:
                    raise SchemaStoreError(f"{name} is defined twice in {directory}")
                named[name] = schema
                namespace = name.rpartition(".")[0] or None
            for field in schema.get("fields", []):
                collect(field["type"], namespace)
            for key in ("items", "values"):
                if key in schema:
                    collect(schema[key], namespace)
            if isinstance(kind, (dict, list)):
                collect(kind, namespace)

    for path in sorted(directory.glob("*.avsc")):
        collect(_read_json(path), None)
    return named


def _full_name(schema: dict[str, Any], namespace: str | None = None) -> str:
    name = schema["name"]
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SchemaStoreError(f"missing schema file {path}") from None
    except json.JSONDecodeError as exc:
        raise SchemaStoreError(f"{path}: not valid JSON ({exc})") from None
