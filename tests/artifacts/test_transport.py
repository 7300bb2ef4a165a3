"""The adapter transport: chunking and reassembly, verification, kafka:// URIs, the fsspec stores (memory:// and a
real HTTP server), and the {run}.artifacts topic on a real broker (publish, fetch by URI, retention of the newest N)."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from distrl_stream.artifacts import dir_size, fetch, publish, sha256_dir
from distrl_stream.artifacts.transport import (
    H_ARTIFACT,
    H_PATH,
    AdapterSource,
    Chunk,
    ChunkWriter,
    KafkaLocation,
    iter_chunks,
    publish_chunks,
)
from distrl_stream.config import Config, load_config
from distrl_stream.errors import ArtifactError, ArtifactIntegrityError, ArtifactUploadError
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics, run_topic_specs
from tests.fixtures.http import BackgroundHttpServer


def _adapter(root: Path, seed: int = 0, big: int = 5000) -> Path:
    rng = random.Random(seed)
    files = {
        "adapter_config.json": b'{"r": 8}',
        "adapter_model.safetensors": rng.randbytes(big),
        "empty.txt": b"",
        "sub/extra.bin": rng.randbytes(300),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _rebuild(chunks: list[Chunk], folder: Path, expected: int) -> Path:
    folder.mkdir()
    writer = ChunkWriter(folder, "policy/v000001")
    for chunk in chunks:
        writer.add(chunk)
    writer.finish(expected)
    return folder


def test_chunks_rebuild_the_folder_byte_for_byte_in_any_order(tmp_path: Path) -> None:
    source = _adapter(tmp_path / "a")
    chunks = list(iter_chunks(source, 1024))
    assert len(chunks) == 5 + 1 + 1 + 1  # 5000 B in 1 KiB pieces, 3 small files (an empty one is one empty chunk)
    assert max(len(c.data) for c in chunks) == 1024
    random.Random(1).shuffle(chunks)
    rebuilt = _rebuild(chunks, tmp_path / "b", len(chunks))
    assert sha256_dir(rebuilt) == sha256_dir(source)
    assert (rebuilt / "empty.txt").read_bytes() == b""


def test_a_corrupted_chunk_is_refused_by_its_own_sha256(tmp_path: Path) -> None:
    chunks = list(iter_chunks(_adapter(tmp_path / "a"), 1024))
    bad = chunks[2]
    chunks[2] = dataclasses.replace(bad, data=bytes([bad.data[0] ^ 1]) + bad.data[1:])
    with pytest.raises(ArtifactIntegrityError, match=r"adapter_model\.safetensors@1024 does not match") as info:
        _rebuild(chunks, tmp_path / "b", len(chunks))
    assert info.value.reason == "chunk"


def test_a_missing_chunk_or_a_chunk_outside_the_folder_is_refused(tmp_path: Path) -> None:
    chunks = list(iter_chunks(_adapter(tmp_path / "a"), 1024))
    with pytest.raises(ArtifactIntegrityError, match="7 of 8 chunks arrived; incomplete files") as info:
        _rebuild(chunks[:3] + chunks[4:], tmp_path / "b", len(chunks))
    assert info.value.reason == "missing"
    escape = dataclasses.replace(chunks[0], path="../outside")
    with pytest.raises(ArtifactIntegrityError, match="out of bounds"):
        _rebuild([escape], tmp_path / "c", 1)
    assert not (tmp_path / "outside").exists()


def test_kafka_uri_names_topic_partition_offsets_and_artifact() -> None:
    where = KafkaLocation("r.artifacts", 0, 120, 131, "policy/v000007", 12)
    assert where.uri == "kafka://r.artifacts/0/120-131?artifact=policy/v000007&chunks=12"
    assert KafkaLocation.parse(where.uri) == where
    for bad in (
        "kafka://r.artifacts/0/131-120?artifact=p/v1&chunks=1",
        "kafka://r.artifacts/0?chunks=1",
        "s3://x/0/1-2",
    ):
        with pytest.raises(ArtifactError, match="malformed kafka artifact URI"):
            KafkaLocation.parse(bad)


def test_fetch_verifies_the_whole_folder_and_leaves_nothing_on_a_mismatch(tmp_path: Path) -> None:
    source = _adapter(tmp_path / "a")
    digest, size = sha256_dir(source), dir_size(source)
    got = fetch(source.as_uri(), tmp_path / "ok", sha256=digest, size_bytes=size)
    assert sha256_dir(got) == digest
    with pytest.raises(ArtifactIntegrityError, match="does not match its weight-version event") as info:
        fetch(source.as_uri(), tmp_path / "bad", sha256="0" * 64, size_bytes=size)
    assert info.value.reason == "hash"
    assert not (tmp_path / "bad").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a", "ok"]
    with pytest.raises(ArtifactIntegrityError, match="does not exist") as info:
        fetch((tmp_path / "nope").as_uri(), tmp_path / "x", sha256=digest, size_bytes=size)
    assert info.value.reason == "missing"
    with pytest.raises(ArtifactError, match="needs the cluster's settings"):
        fetch("kafka://r.artifacts/0/1-2?artifact=p/v000001&chunks=2", tmp_path / "y", sha256=digest, size_bytes=1)


def test_file_store_publishes_the_learners_own_folder(tmp_path: Path) -> None:
    cfg = load_config(None, artifacts={"store": "file"}, data_dir=tmp_path)
    source = _adapter(tmp_path / "a")
    assert publish(cfg, 1, source) == source.resolve().as_uri()


def test_fsspec_store_uploads_under_run_policy_version_and_fetches_back(tmp_path: Path) -> None:
    cfg = load_config(None, run="r1", artifacts={"store": "memory://bucket/prefix/"}, data_dir=tmp_path)
    source = _adapter(tmp_path / "a")
    uri = publish(cfg, 3, source)
    assert uri == "memory://bucket/prefix/r1/policy/v000003"
    got = fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source))
    assert sha256_dir(got) == sha256_dir(source)
    with pytest.raises(ArtifactIntegrityError, match="does not exist"):
        fetch(uri.replace("v000003", "v000004"), tmp_path / "c", sha256=sha256_dir(source), size_bytes=1)


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real read-only HTTP server (stdlib, directory listings on) serving a fresh folder."""
    root = tmp_path / "www"
    root.mkdir()
    with BackgroundHttpServer(functools.partial(_QuietHandler, directory=str(root))) as server:
        yield root, server.url


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_fsspec_fetch_over_a_real_http_server(http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, url = http_root
    source = _adapter(tmp_path / "a")
    shutil.copytree(source, root / "run" / "policy" / "v000001")  # what an upload to the web root leaves
    uri = f"{url}/run/policy/v000001"
    got = fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source))
    assert sha256_dir(got) == sha256_dir(source)
    assert (got / "sub" / "extra.bin").read_bytes() == (source / "sub" / "extra.bin").read_bytes()
    with pytest.raises(ArtifactIntegrityError) as info:
        fetch(f"{url}/run/policy/v000009", tmp_path / "c", sha256=sha256_dir(source), size_bytes=1)
    assert info.value.reason == "missing"


@pytest.fixture
def artifacts_config(make_config: Callable[..., Config], kafka_admin: Admin) -> Iterator[Config]:
    cfg = make_config(artifacts={"chunk_bytes": 1024, "keep_versions": 2})
    ensure_run_topics(cfg, kafka_admin)
    yield cfg
    delete_run_topics(cfg, kafka_admin)


@pytest.mark.kafka
def test_kafka_store_round_trip_reads_exactly_the_versions_offsets(artifacts_config: Config, tmp_path: Path) -> None:
    cfg = artifacts_config
    first, second = _adapter(tmp_path / "a", seed=1), _adapter(tmp_path / "b", seed=2, big=3000)
    with Producer(cfg.kafka) as producer:
        uri1 = publish(cfg, 1, first, producer)
        uri2 = publish(cfg, 2, second, producer)
    one, two = KafkaLocation.parse(uri1), KafkaLocation.parse(uri2)
    assert (one.topic, one.partition, one.first, one.last, one.chunks) == (TopicNames(cfg.run).artifacts, 0, 0, 7, 8)
    assert (two.first, two.last, two.artifact) == (8, 13, "policy/v000002")
    for uri, source, dest in ((uri1, first, "f1"), (uri2, second, "f2")):
        got = fetch(uri, tmp_path / dest, sha256=sha256_dir(source), size_bytes=dir_size(source), kafka=cfg.kafka)
        assert sha256_dir(got) == sha256_dir(source)


@pytest.mark.kafka
def test_kafka_store_refuses_a_corrupted_chunk(artifacts_config: Config, tmp_path: Path) -> None:
    cfg = artifacts_config
    source = _adapter(tmp_path / "a")
    chunks = list(iter_chunks(source, 1024))
    chunks[1] = dataclasses.replace(chunks[1], data=b"x" * len(chunks[1].data))  # damaged after hashing
    with Producer(cfg.kafka) as producer:
        where = publish_chunks(cfg, producer, 1, iter(chunks))
    with pytest.raises(ArtifactIntegrityError, match=r"chunk adapter_model\.safetensors@0 does not match") as info:
        fetch(where.uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source), kafka=cfg.kafka)
    assert info.value.reason == "chunk" and not (tmp_path / "b").exists()


@pytest.mark.kafka
def test_artifacts_topic_keeps_only_the_newest_versions(
    make_config: Callable[..., Config], kafka_admin: Admin, tmp_path: Path
) -> None:
    # Chunks of ~0.6 MiB in 1 MiB segments (Kafka's smallest): the log rolls every other chunk, so the cleaner sees
    # all but the newest version's last chunk. Otherwise the production layout.
    cfg = make_config(artifacts={"chunk_bytes": 600 * 1024, "keep_versions": 2})
    spec = next(s for s in run_topic_specs(cfg.run, cfg.kafka) if s.name == TopicNames(cfg.run).artifacts)
    fast = {"segment.bytes": str(1024 * 1024), "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}
    kafka_admin.create_topics([dataclasses.replace(spec, config={**spec.config, **fast})])
    sources = [_adapter(tmp_path / f"v{v}", seed=v, big=1100 * 1024) for v in (1, 2, 3, 4)]
    try:
        with Producer(cfg.kafka) as producer:
            uris = [publish(cfg, v, sources[v - 1], producer) for v in (1, 2, 3, 4)]

        def fetch_version(v: int) -> Path:
            source = sources[v - 1]
            dest = tmp_path / f"got-{v}-{time.monotonic_ns()}"
            return fetch(uris[v - 1], dest, sha256=sha256_dir(source), size_bytes=dir_size(source), kafka=cfg.kafka)

        deadline = time.monotonic() + 45
        while True:
            try:
                fetch_version(1)
            except ArtifactIntegrityError as exc:
                assert exc.reason == "missing"
                break
            assert time.monotonic() < deadline, "version 1 still readable: compaction did not remove it"
        for v in (3, 4):  # the newest keep_versions = 2 stay whole
            assert sha256_dir(fetch_version(v)) == sha256_dir(sources[v - 1])
    finally:
        kafka_admin.delete_topics([spec.name])


# --- where a server may fetch from, and what it reads before it copies -------------------------------------------


def test_a_uri_outside_the_configured_store_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    source = _adapter(tmp_path / "a")
    digest, size = sha256_dir(source), dir_size(source)
    kafka_store, object_store = AdapterSource("kafka", "r1"), AdapterSource("memory://bucket/prefix", "r1")
    for uri, allowed_by in (
        (source.as_uri(), kafka_store),  # the learner publishes to Kafka: a local folder is nobody's adapter
        ("kafka://r2.artifacts/0/0-3?artifact=policy/v000001&chunks=4", kafka_store),  # another run's topic
        ("memory://bucket/other/r1/policy/v000001", object_store),  # outside <store>/<run>/
        ("s3://bucket/prefix/r1/policy/v000001", object_store),
        ("kafka://r1.artifacts/0/0-3?artifact=policy/v000001&chunks=4", AdapterSource("file", "r1")),
    ):
        with pytest.raises(ArtifactError, match=r"is outside artifacts\.store"):
            fetch(uri, tmp_path / "dest", sha256=digest, size_bytes=size, source=allowed_by)
        assert not (tmp_path / "dest").exists()
    assert sha256_dir(fetch(source.as_uri(), tmp_path / "ok", sha256=digest, size_bytes=size)) == digest


def test_a_local_folder_is_measured_and_hashed_before_it_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _adapter(tmp_path / "a")
    digest, size = sha256_dir(source), dir_size(source)
    copied: list[object] = []
    monkeypatch.setattr(shutil, "copytree", lambda *args, **kwargs: copied.append(args))
    for sha, size_bytes, why in ((digest, size - 1, "holds more than"), ("0" * 64, size, "does not match")):
        with pytest.raises(ArtifactIntegrityError, match=why) as info:
            fetch(source.as_uri(), tmp_path / "dest", sha256=sha, size_bytes=size_bytes)
        assert info.value.reason == "hash"
    assert copied == []  # a URI naming a model, a home folder or a wrong version costs no copy


def test_an_object_store_folder_of_another_size_is_not_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, run="r1", artifacts={"store": "memory://bucket/sizes/"}, data_dir=tmp_path)
    source = _adapter(tmp_path / "a")
    uri = publish(cfg, 1, source)
    downloads: list[object] = []
    monkeypatch.setattr("fsspec.implementations.memory.MemoryFileSystem.get_file", lambda *a, **k: downloads.append(a))
    with pytest.raises(ArtifactIntegrityError, match="not the 10 published") as info:
        fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=10)
    assert info.value.reason == "hash" and downloads == []


@pytest.mark.kafka
def test_a_chunk_without_its_headers_or_with_headers_that_are_not_utf8_is_a_corrupted_chunk(
    artifacts_config: Config, tmp_path: Path
) -> None:
    cfg = artifacts_config
    source = _adapter(tmp_path / "a")
    topic = TopicNames(cfg.run).artifacts
    name = "policy/v000001"
    with Producer(cfg.kafka) as producer:
        for headers in ([(H_ARTIFACT, name.encode())], [(H_ARTIFACT, name.encode()), (H_PATH, b"\xff\xfe")]):
            offsets: list[int] = []
            producer.produce(
                topic, b"data", "policy/s1/000000", headers=headers, partition=0, on_delivery=_offset_into(offsets)
            )
            producer.flush()
            uri = KafkaLocation(topic, 0, offsets[0], offsets[0], name, 1).uri
            with pytest.raises(ArtifactIntegrityError, match="offset") as info:
                fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source), kafka=cfg.kafka)
            assert info.value.reason == "chunk" and not (tmp_path / "b").exists()


def _offset_into(offsets: list[int]) -> Callable[[object, object], None]:
    return lambda err, msg: offsets.append(msg.offset())  # type: ignore[attr-defined]


def test_an_upload_the_store_refuses_is_retried_with_a_backoff_then_refused_naming_the_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = {"store": "memory://bucket/retries", "upload_retries": 2, "upload_backoff_s": 0.01}
    cfg = load_config(None, run="r2", artifacts=artifacts, data_dir=tmp_path)
    source = _adapter(tmp_path / "a")
    put, refusals = MemoryFileSystem.put, [2]

    def throttled(self: MemoryFileSystem, *args: Any, **kwargs: Any) -> Any:
        if refusals[0]:
            refusals[0] -= 1
            raise OSError("503 SlowDown")
        return put(self, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put", throttled)
    uri = publish(cfg, 1, source)  # refused twice, then stored
    got = fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source))
    assert sha256_dir(got) == sha256_dir(source) and refusals == [0]
    refusals[0] = 3
    with pytest.raises(ArtifactUploadError, match=r"v000002 \(3 attempts\): OSError: 503 SlowDown"):
        publish(cfg, 2, source)


def test_storage_options_reach_the_object_stores_filesystem_on_upload_and_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"secret": "s3cret", "endpoint_url": "http://minio"}
    store = {"store": "memory://bucket/options", "storage_options": options}
    cfg = load_config(None, run="r3", artifacts=store, data_dir=tmp_path)
    seen: list[dict[str, Any]] = []
    put, get_file = MemoryFileSystem.put, MemoryFileSystem.get_file

    def put_seen(self: MemoryFileSystem, *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(self.storage_options))
        return put(self, *args, **kwargs)

    def get_seen(self: MemoryFileSystem, *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(self.storage_options))
        return get_file(self, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put", put_seen)
    monkeypatch.setattr(MemoryFileSystem, "get_file", get_seen)
    source = _adapter(tmp_path / "a")
    uri = publish(cfg, 1, source)
    assert "s3cret" not in uri
    storage_options = cfg.artifacts.storage_options_values()
    fetch(uri, tmp_path / "b", sha256=sha256_dir(source), size_bytes=dir_size(source), storage_options=storage_options)
    assert seen and all(s == options for s in seen)
