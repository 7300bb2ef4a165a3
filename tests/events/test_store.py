"""The schema store: ids fixed by ids.json, fingerprints guarding published schemas, evolution kept readable."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.utils import generate_many

from distrl_stream.errors import SchemaStoreError
from distrl_stream.events import SchemaStore, default_store
from distrl_stream.events.store import DEFAULT_SCHEMA_DIR


def test_ids_are_those_of_the_manifest() -> None:
    manifest = json.loads((DEFAULT_SCHEMA_DIR / "ids.json").read_text())
    store = default_store()
    assert {(e.id, e.name, e.version) for e in store} == {
        (m["id"], m["name"], m["version"]) for m in manifest["schemas"]
    }
    assert store.latest("distrl.TrajectoryEvent").id == 9
    assert store.latest("distrl.MetricEvent").version == 2


def test_ids_are_the_same_in_another_process() -> None:
    code = (
        "from distrl_stream.events import Serde, EVENT_TYPES; s = Serde(); "
        "print(','.join(f'{c.__name__}={s.schema_id(c)}' for c in EVENT_TYPES))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    from distrl_stream.events import EVENT_TYPES, Serde

    serde = Serde()
    assert out == ",".join(f"{c.__name__}={serde.schema_id(c)}" for c in EVENT_TYPES)


def _copy_schemas(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(DEFAULT_SCHEMA_DIR, target)
    return target


def test_editing_a_published_schema_fails_loading_with_what_to_do(tmp_path: Path) -> None:
    schemas = _copy_schemas(tmp_path)
    path = schemas / "WeightVersionEvent.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append({"name": "note", "type": "string", "default": ""})
    path.write_text(json.dumps(schema))
    with pytest.raises(SchemaStoreError, match=r"no longer matches schema id 6 .*new id"):
        SchemaStore.load(schemas)


def test_editing_a_nested_record_invalidates_the_event_that_embeds_it(tmp_path: Path) -> None:
    schemas = _copy_schemas(tmp_path)
    path = schemas / "Tensor.avsc"
    schema = json.loads(path.read_text())
    schema["fields"][1]["type"] = "bytes"
    path.write_text(json.dumps(schema))
    with pytest.raises(SchemaStoreError, match="schema id 9 "):
        SchemaStore.load(schemas)


def test_docs_and_defaults_do_not_change_a_fingerprint(tmp_path: Path) -> None:
    schemas = _copy_schemas(tmp_path)
    path = schemas / "DeadLetter.avsc"
    schema = json.loads(path.read_text())
    schema["doc"] = "reworded"
    path.write_text(json.dumps(schema))
    assert SchemaStore.load(schemas).latest("distrl.DeadLetter").id == 4


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    schemas = _copy_schemas(tmp_path)
    manifest = json.loads((schemas / "ids.json").read_text())
    manifest["schemas"][1]["id"] = manifest["schemas"][0]["id"]
    (schemas / "ids.json").write_text(json.dumps(manifest))
    with pytest.raises(SchemaStoreError, match="duplicate id"):
        SchemaStore.load(schemas)


def test_missing_schema_folder_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(SchemaStoreError, match=str(tmp_path)):
        SchemaStore.load(tmp_path)


def test_every_version_reads_with_the_latest_schema_of_its_record() -> None:
    """BACKWARD compatibility: any record an older version wrote resolves to the current reader schema."""
    store = default_store()
    older = [e for e in store if store.latest(e.name).id != e.id]
    assert older, "the store keeps at least one superseded version"
    for entry in older:
        latest = store.latest(entry.name)
        for record in generate_many(entry.schema, 20):
            buf = io.BytesIO()
            schemaless_writer(buf, entry.parsed, record)
            buf.seek(0)
            read = schemaless_reader(buf, entry.parsed, latest.parsed)
            assert set(read) == {f["name"] for f in latest.schema["fields"]}
