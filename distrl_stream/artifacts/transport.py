"""Moving an adapter folder from the learner to the servers: one publish / fetch API over every store.

The learner writes each version into its own artifact folder (:mod:`.store`), then :func:`publish` puts it where
``artifacts.store`` says and returns the URI the weight-version event carries. A server gives that URI to
:func:`fetch`, which dispatches on its scheme, rebuilds the folder in a private place and checks it against the
event's sha256 and size before anyone loads it:

- ``kafka://<topic>/<partition>/<first>-<last>?artifact=<policy_id>/v<NNNNNN>&chunks=<n>``: the folder travels on
  ``{run}.artifacts`` as ``n`` chunks at offsets ``first..last`` of one partition, so a reader assigns that
  partition at ``first`` and stops at ``last`` without scanning the topic. The broker address is not in the URI: a
  reader uses its own ``kafka`` settings (hosts may reach the cluster through different listeners).
- ``file:///abs/path`` (or a plain path): the learner's own folder, for servers on its host or a shared filesystem.
- any other fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ``memory://``): ``<store>/<run>/<policy_id>/v<NNNNNN>``.

Chunks are Kafka records with raw bytes as the value and their description in headers (``distrl-artifact``,
``distrl-path``, ``distrl-offset``, ``distrl-file-size``, ``distrl-index``, ``distrl-chunks``, ``distrl-sha256``),
not Avro events: the payload is opaque bytes that Avro would only copy and frame, and the headers are routing data a
reader checks before it touches the value. Every chunk carries the sha256 of its own bytes, so a corrupted record is
named as such; the whole folder's :func:`~.store.sha256_dir` is on the event.

Retention: a chunk's key is ``<policy_id>/s<version % artifacts.keep_versions>/<index>``, so version v overwrites
the keys of version v - keep_versions and the compacted topic keeps each policy's newest ``keep_versions`` versions
(a late server fetches the newest one named on the compacted ``{run}.weights``). Older versions disappear when the
log cleaner runs; fetching one then fails as ``missing``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from distrl_stream.artifacts.store import atomic_dir, dir_size, local_path, sha256_dir
from distrl_stream.config import Config, KafkaConfig, mask_secrets
from distrl_stream.errors import ArtifactError, ArtifactIntegrityError, ArtifactUploadError
from distrl_stream.kafka.consumer import Consumer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames

log = logging.getLogger(__name__)

H_ARTIFACT, H_PATH, H_OFFSET, H_SIZE, H_INDEX, H_CHUNKS, H_SHA = (
    "distrl-artifact",
    "distrl-path",
    "distrl-offset",
    "distrl-file-size",
    "distrl-index",
    "distrl-chunks",
    "distrl-sha256",
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one file of an adapter folder.

    Attributes:
        path: the file, relative to the folder (POSIX separators).
        offset: where ``data`` starts in the file.
        file_size: the whole file's size.
        data: the bytes.
        sha256: hex sha256 of ``data`` as published.
    """

    path: str
    offset: int
    file_size: int
    data: bytes
    sha256: str


@dataclass(frozen=True, slots=True)
class KafkaLocation:
    """Where a version's chunks are: ``topic``/``partition`` offsets ``first..last`` (inclusive)."""

    topic: str
    partition: int
    first: int
    last: int
    artifact: str
    chunks: int

    @property
    def uri(self) -> str:
        """The ``kafka://`` URI of these chunks."""
        query = urlencode({"artifact": self.artifact, "chunks": self.chunks}, safe="/")
        return f"kafka://{self.topic}/{self.partition}/{self.first}-{self.last}?{query}"

    @classmethod
    def parse(cls, uri: str) -> KafkaLocation:
        """Read a ``kafka://`` URI.

        Raises:
            ArtifactError: not a well-formed ``kafka://`` artifact URI.
        """
        parsed = urlparse(uri)
        query = parse_qs(parsed.query)
        try:
            partition, span = parsed.path.strip("/").split("/")
            first, last = (int(x) for x in span.split("-"))
            location = cls(parsed.netloc, int(partition), first, last, query["artifact"][0], int(query["chunks"][0]))
        except (ValueError, KeyError, IndexError):
            raise ArtifactError(
                f"malformed kafka artifact URI {uri!r} "
                "(expected kafka://<topic>/<partition>/<first>-<last>?artifact=<policy>/v<N>&chunks=<n>)"
            ) from None
        if parsed.scheme != "kafka" or not location.topic or location.chunks < 1 or location.last < location.first:
            raise ArtifactError(f"malformed kafka artifact URI {uri!r}")
        return location


def artifact_name(policy_id: str, version: int) -> str:
    """The name a version's chunks carry: ``<policy_id>/v<NNNNNN>``."""
    return f"{policy_id}/v{version:06d}"


def iter_chunks(folder: Path, chunk_bytes: int) -> Iterator[Chunk]:
    """The folder's files in sorted path order, each cut into chunks of at most ``chunk_bytes``.

    Raises:
        ArtifactError: the folder is missing or holds a symlink.
    """
    for rel, path, size in _files(folder):
        with path.open("rb") as fh:
            offset = 0
            while True:
                data = fh.read(chunk_bytes)
                yield Chunk(rel, offset, size, data, hashlib.sha256(data).hexdigest())
                offset += len(data)
                if offset >= size:
                    break


class ChunkWriter:
    """Rebuilds a folder from chunks in any order, checking each chunk's sha256 before writing it.

    Args:
        folder: an empty folder to write into.
        name: names the artifact in errors.
    """

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self.chunks = 0
        self._sizes: dict[str, int] = {}
        self._written: dict[str, int] = {}

    def add(self, chunk: Chunk) -> None:
        """Write one chunk.

        Raises:
            ArtifactIntegrityError: its bytes do not match its sha256 (``chunk``), or its path leaves the folder.
        """
        if hashlib.sha256(chunk.data).hexdigest() != chunk.sha256:
            raise ArtifactIntegrityError(
                f"{self.name}: chunk {chunk.path}@{chunk.offset} does not match its sha256 {chunk.sha256[:16]}…",
                "chunk",
            )
        target = (self.folder / chunk.path).resolve()
        if not target.is_relative_to(self.folder.resolve()) or chunk.offset + len(chunk.data) > chunk.file_size:
            raise ArtifactIntegrityError(f"{self.name}: chunk {chunk.path}@{chunk.offset} is out of bounds", "chunk")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("r+b" if target.exists() else "wb") as fh:
            fh.seek(chunk.offset)
            fh.write(chunk.data)
        self._sizes[chunk.path] = chunk.file_size
        self._written[chunk.path] = self._written.get(chunk.path, 0) + len(chunk.data)
        self.chunks += 1

    def finish(self, expected_chunks: int) -> None:
        """Check that every chunk arrived and every file is whole.

        Raises:
            ArtifactIntegrityError: chunks or bytes are missing (``missing``).
        """
        short = sorted(p for p, size in self._sizes.items() if self._written[p] != size)
        if self.chunks != expected_chunks or short:
            raise ArtifactIntegrityError(
                f"{self.name}: {self.chunks} of {expected_chunks} chunks arrived"
                + (f"; incomplete files: {', '.join(short)}" if short else ""),
                "missing",
            )


def publish(cfg: Config, version: int, folder: Path, producer: Producer | None = None) -> str:
    """Put the finished adapter ``folder`` of ``version`` where ``artifacts.store`` says; returns its URI.

    Args:
        cfg: the run, policy id and ``artifacts`` settings.
        version: the policy version.
        folder: the complete adapter folder (the learner's artifact folder).
        producer: for ``kafka``: the role's producer (chunks are flushed before this returns).

    Raises:
        KafkaClientError: a chunk was not acknowledged.
        ArtifactUploadError: the object store refused the upload ``artifacts.upload_retries`` more times, waiting
            ``upload_backoff_s`` doubling between them.
    """
    store = cfg.artifacts.store
    if store == "file":
        return folder.resolve().as_uri()
    if store == "kafka":
        if producer is None:
            raise ArtifactError("artifacts.store = kafka: publishing needs a producer")
        return publish_chunks(cfg, producer, version, iter_chunks(folder, cfg.artifacts.chunk_bytes)).uri
    import fsspec  # only a role that uses an object store pays for the import

    url = f"{store.rstrip('/')}/{cfg.run}/{cfg.model.policy_id}/v{version:06d}"
    fs, path = fsspec.core.url_to_fs(url, **cfg.artifacts.storage_options_values())
    attempts, delay = cfg.artifacts.upload_retries + 1, cfg.artifacts.upload_backoff_s
    for attempt in range(1, attempts + 1):
        try:
            fs.put(f"{folder}/", path, recursive=True)
            return url
        # Each backend raises its own errors (s3fs, gcsfs, botocore's credential errors are no OSError).
        except Exception as exc:
            error = f"{type(exc).__name__}: {mask_secrets(str(exc))}"
        if attempt < attempts:
            log.warning("upload of %s to %s failed (%s); retrying in %.1fs", folder.name, url, error, delay)
            time.sleep(delay)
            delay *= 2
    raise ArtifactUploadError(f"artifacts.store: cannot upload {folder} to {url} ({attempts} attempts): {error}")


def publish_chunks(cfg: Config, producer: Producer, version: int, chunks: Iterator[Chunk]) -> KafkaLocation:
    """Produce ``chunks`` of ``version`` onto ``{run}.artifacts`` and wait for all of them (see the module docstring).

    Raises:
        KafkaClientError: a chunk was not acknowledged.
        ArtifactError: there are no chunks (an empty folder).
    """
    topic = TopicNames(cfg.run).artifacts
    policy = cfg.model.policy_id
    items = list(chunks)  # every chunk's header carries the count; an adapter is MBs, so holding it is fine
    name = artifact_name(policy, version)
    if not items:
        raise ArtifactError(f"{name}: the adapter folder holds no files")
    slot = version % cfg.artifacts.keep_versions
    offsets: list[int] = []
    for index, chunk in enumerate(items):
        headers = {
            H_ARTIFACT: name,
            H_PATH: chunk.path,
            H_OFFSET: str(chunk.offset),
            H_SIZE: str(chunk.file_size),
            H_INDEX: str(index),
            H_CHUNKS: str(len(items)),
            H_SHA: chunk.sha256,
        }
        producer.produce(
            topic,
            chunk.data,
            f"{policy}/s{slot}/{index:06d}",
            headers=list(headers.items()),
            partition=0,
            on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None,
        )
    producer.flush()
    return KafkaLocation(topic, 0, min(offsets), max(offsets), name, len(items))


@dataclass(frozen=True, slots=True)
class AdapterSource:
    """Where a reader may fetch adapters from: what its ``artifacts.store`` publishes to, nowhere else.

    A weight event's URI is data from the topic, so a server checks it before it touches the place it names:
    ``kafka`` allows only ``kafka://`` URIs on the run's own ``{run}.artifacts``; ``file`` only local paths
    (``file://`` or a plain path); an object store only URLs under ``<store>/<run>/``, its publish prefix.

    Attributes:
        store: the reader's ``artifacts.store``.
        run: the run, which names the artifacts topic and the object-store prefix.
    """

    store: str
    run: str

    @classmethod
    def of(cls, cfg: Config) -> AdapterSource:
        """The source ``cfg``'s learner publishes to."""
        return cls(cfg.artifacts.store, cfg.run)

    def check(self, uri: str) -> None:
        """Refuse a URI outside this source.

        Raises:
            ArtifactError: ``uri`` is not one ``artifacts.store`` publishes.
        """
        scheme = urlparse(uri).scheme
        if self.store == "kafka":
            allowed = scheme == "kafka" and KafkaLocation.parse(uri).topic == TopicNames(self.run).artifacts
            where = f"kafka://{TopicNames(self.run).artifacts}/…"
        elif self.store == "file":
            allowed, where = scheme in ("", "file"), "a local folder (file://)"
        else:
            where = f"{self.store.rstrip('/')}/{self.run}/"
            allowed = uri.startswith(where)
        if not allowed:
            raise ArtifactError(f"adapter URI {uri[:200]!r} is outside artifacts.store {self.store!r} ({where})")


def fetch(
    uri: str,
    dest: Path,
    *,
    sha256: str,
    size_bytes: int,
    kafka: KafkaConfig | None = None,
    timeout_s: float = 120.0,
    source: AdapterSource | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """Rebuild the adapter folder ``uri`` names at ``dest`` (which must not exist) and verify it as a whole.

    The folder is written beside ``dest`` and renamed into place only once its sha256 and size match, so ``dest``
    is either absent or the verified adapter.

    Args:
        uri: ``kafka://``, ``file://`` (or a path) or an fsspec URL, as on the weight-version event.
        dest: the folder to create.
        sha256: the event's :func:`~.store.sha256_dir` of the folder.
        size_bytes: the event's total size of its files.
        kafka: the cluster to read a ``kafka://`` URI from (the reader's own settings).
        timeout_s: bound on reading the chunks of a ``kafka://`` URI.
        source: where fetching is allowed (the reader's ``artifacts.store``); None allows every scheme.
        storage_options: the fsspec filesystem's arguments for an fsspec URL (``artifacts.storage_options``).

    Raises:
        ArtifactIntegrityError: a chunk is corrupted (``chunk``), the folder does not match ``sha256`` / ``size_bytes``
            (``hash``), or records or files are missing (``missing``).
        ArtifactError: the URI is malformed or outside ``source``, or it is ``kafka://`` and ``kafka`` is None.
    """
    try:
        urlparse(uri)
    except ValueError as exc:  # an unbalanced IPv6 bracket, say
        raise ArtifactError(f"malformed adapter URI {uri[:200]!r}: {exc}") from None
    if source is not None:
        source.check(uri)
    with atomic_dir(dest) as tmp:
        _fetch_into(uri, tmp, kafka, timeout_s, sha256, size_bytes, storage_options or {})
        digest, size = sha256_dir(tmp), dir_size(tmp)
        if digest != sha256 or size != size_bytes:
            raise ArtifactIntegrityError(
                f"adapter {uri} does not match its weight-version event (sha256 {digest[:16]}…, {size} bytes; "
                f"published {sha256[:16]}…, {size_bytes} bytes)",
                "hash",
            )
    return dest


def _fetch_into(
    uri: str,
    tmp: Path,
    kafka: KafkaConfig | None,
    timeout_s: float,
    sha256: str,
    size_bytes: int,
    storage_options: Mapping[str, Any],
) -> None:
    scheme = urlparse(uri).scheme
    if scheme in ("", "file"):
        source = local_path(uri)
        if not source.is_dir():
            raise ArtifactIntegrityError(f"adapter folder {source} does not exist", "missing")
        # Checked before the copy, so a URI naming some other folder (a model, a home directory) is never copied
        # whole; the private copy is hashed again after it, as what gets loaded.
        _check_before_copy(uri, source, sha256, size_bytes)
        shutil.copytree(source, tmp, symlinks=True, dirs_exist_ok=True)
    elif scheme == "kafka":
        if kafka is None:
            raise ArtifactError(f"{uri}: fetching a kafka:// artifact needs the cluster's settings")
        fetch_chunks(kafka, KafkaLocation.parse(uri), tmp, timeout_s)
    else:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(uri, **storage_options)
            if not fs.isdir(path):
                raise ArtifactIntegrityError(f"adapter {uri} does not exist", "missing")
            root = path.rstrip("/")
            listing = fs.find(root, detail=True)
            sizes = [info.get("size") for info in listing.values()]
            # Before downloading anything, where the store lists sizes (an http(s) listing page does not).
            if None not in sizes and sum(sizes) != size_bytes:
                raise ArtifactIntegrityError(
                    f"adapter {uri} holds {sum(sizes)} bytes, not the {size_bytes} published", "hash"
                )
            fetched = 0
            # File by file: over http(s) a "folder" is only a listing page, which fs.get would try to save as a file.
            for remote in listing:
                local = tmp / remote[len(root) :].lstrip("/")
                local.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(local))
                fetched += local.stat().st_size
                if fetched > size_bytes:
                    raise ArtifactIntegrityError(
                        f"adapter {uri} holds more than the {size_bytes} bytes published", "hash"
                    )
        except (OSError, ValueError) as exc:
            raise ArtifactIntegrityError(f"cannot download adapter {uri}: {exc}", "missing") from None


def fetch_chunks(kafka: KafkaConfig, where: KafkaLocation, folder: Path, timeout_s: float) -> None:
    """Read offsets ``where.first..where.last`` and rebuild the folder from the chunks of ``where.artifact``.

    Raises:
        ArtifactIntegrityError: a chunk is corrupted, or some chunks are gone (compacted away) or never arrive.
    """
    writer = ChunkWriter(folder, where.artifact)
    with Consumer(kafka, client_id="artifact-fetch") as consumer:
        _low, high = consumer.watermarks(where.topic, [where.partition])[where.partition]
        if high <= where.last:
            raise ArtifactIntegrityError(
                f"{where.artifact}: {where.topic}/{where.partition} ends at offset {high}, before {where.last}",
                "missing",
            )
        consumer.assign_offsets(where.topic, {where.partition: where.first})
        deadline = time.monotonic() + timeout_s
        position = where.first
        while position <= where.last:
            if time.monotonic() > deadline:
                raise ArtifactIntegrityError(
                    f"{where.artifact}: timed out after {timeout_s:.0f} s at offset {position} of {where.last}",
                    "missing",
                )
            # consume() waits for as many records as asked (or the timeout): ask for no more than the range holds.
            for msg in consumer.consume(min(500, where.last - position + 1), 0.5):
                position = msg.offset() + 1
                if msg.offset() > where.last:
                    break
                chunk = chunk_from_record(msg.headers(), msg.value(), where.artifact, msg.offset())
                if chunk is not None:
                    writer.add(chunk)
    writer.finish(where.chunks)


def chunk_from_record(
    headers: list[tuple[str, bytes | None]] | None, value: bytes | None, artifact: str, offset: int
) -> Chunk | None:
    """The chunk a record of ``{run}.artifacts`` carries, or None when it belongs to another artifact.

    Raises:
        ArtifactIntegrityError: the record is one of ``artifact``'s but its headers are missing or unreadable
            (``chunk``).
    """
    fields: dict[str, str] = {}
    unreadable = []
    for key, raw in headers or []:
        try:
            fields[key] = (raw or b"").decode()
        except UnicodeDecodeError:
            unreadable.append(key)
    if fields.get(H_ARTIFACT) != artifact:
        return None  # a newer version's chunks reuse the keys, never the offsets; skip strays anyway
    if unreadable:
        raise ArtifactIntegrityError(
            f"{artifact}: the record at offset {offset} has headers that are not UTF-8: {', '.join(unreadable)}",
            "chunk",
        )
    try:
        return Chunk(fields[H_PATH], int(fields[H_OFFSET]), int(fields[H_SIZE]), value or b"", fields[H_SHA])
    except (KeyError, ValueError) as exc:
        raise ArtifactIntegrityError(
            f"{artifact}: the record at offset {offset} has no readable chunk headers ({type(exc).__name__}: {exc})",
            "chunk",
        ) from None


def _check_before_copy(uri: str, source: Path, sha256: str, size_bytes: int) -> None:
    total = 0
    for root, _dirs, names in os.walk(source):
        for name in names:
            path = Path(root) / name
            if path.is_symlink():
                raise ArtifactIntegrityError(f"adapter {uri}: symlink {path} (not allowed)", "hash")
            total += path.stat().st_size
            if total > size_bytes:  # stop at once: the folder may be far larger than an adapter
                raise ArtifactIntegrityError(f"adapter {uri} holds more than the {size_bytes} bytes published", "hash")
    if total != size_bytes or sha256_dir(source) != sha256:
        raise ArtifactIntegrityError(
            f"adapter {uri} does not match its weight-version event ({total} bytes; published {sha256[:16]}…, "
            f"{size_bytes} bytes)",
            "hash",
        )


def _files(folder: Path) -> list[tuple[str, Path, int]]:
    if not folder.is_dir():
        raise ArtifactError(f"not a folder: {folder}")
    out = []
    for path in folder.rglob("*"):
        if path.is_symlink():
            raise ArtifactError(f"symlink in artifact folder (not allowed): {path}")
        if path.is_file():
            out.append((path.relative_to(folder).as_posix(), path, path.stat().st_size))
    return sorted(out)
