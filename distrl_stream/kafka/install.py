"""Finding and installing Apache Kafka: ``KAFKA_HOME``, the installation this environment recorded (``kafka use``,
which ``make setup`` runs), or official release archives unpacked into a user cache.

An installation is any folder laid out like the official release: ``libs/`` holding ``kafka_<scala>-<version>.jar``
(or at least ``kafka-clients-<version>.jar``) and its dependencies. Downloads come from the Apache mirrors and are
always checked against the release's ``.sha512`` file; a local archive is checked when a checksum file is given or
sits beside it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from distrl_stream.errors import BrokerError, KafkaInstallError

log = logging.getLogger(__name__)

DEFAULT_KAFKA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
# downloads.apache.org keeps only current releases; the archive keeps every release.
APACHE_MIRRORS = ("https://downloads.apache.org/kafka", "https://archive.apache.org/dist/kafka")

Progress = Callable[[int, int | None], None]  # (bytes done, total bytes or None)

_SERVER_JAR = re.compile(r"^kafka_(\d+\.\d+)-(\d[\w.\-]*?)\.jar$")
_CLIENTS_JAR = re.compile(r"^kafka-clients-(\d[\w.\-]*?)\.jar$")
_CHUNK = 1 << 20


def kafka_cache_dir() -> Path:
    """Where ``kafka install`` puts releases: ``$XDG_CACHE_HOME/distrl-stream/kafka`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "distrl-stream" / "kafka"


def kafka_record_file() -> Path:
    """Where ``kafka use`` records this environment's Kafka installation: ``<sys.prefix>/distrl-kafka-home``.

    In the environment, not the data folder: ``make setup`` made both, and every ``distrl-stream`` of this
    environment finds it, whatever folder it runs in and without the Makefile's ``KAFKA_HOME``.
    """
    return Path(sys.prefix) / "distrl-kafka-home"


def record_kafka_home(home: Path, record: Path | None = None) -> Path:
    """Record ``home`` as this environment's Kafka installation (see :func:`find_kafka_home`); returns it, absolute.

    Raises:
        KafkaInstallError: ``home`` is not a Kafka installation.
    """
    home = home.expanduser().resolve()
    installation_name(home)
    (record or kafka_record_file()).write_text(f"{home}\n")
    return home


def recorded_kafka_home(record: Path | None = None) -> Path | None:
    """The installation :func:`record_kafka_home` recorded, or None."""
    try:
        text = (record or kafka_record_file()).read_text().strip()
    except FileNotFoundError:
        return None
    return Path(text) if text else None


def installation_name(home: Path) -> str:
    """The release name of an installation, e.g. ``kafka_2.13-4.4.0``.

    Raises:
        KafkaInstallError: ``home`` has no ``libs/`` folder with the Kafka jars.
    """
    libs = home / "libs"
    names = sorted(p.name for p in libs.glob("*.jar")) if libs.is_dir() else []
    for name in names:
        if m := _SERVER_JAR.match(name):
            return f"kafka_{m.group(1)}-{m.group(2)}"
    for name in names:
        if m := _CLIENTS_JAR.match(name):
            return f"kafka-{m.group(1)}"
    raise KafkaInstallError(f"{home} is not an Apache Kafka installation: no libs/kafka_*.jar")


def kafka_version(home: Path) -> str:
    """The Kafka version of an installation (from its jar names)."""
    return installation_name(home).rpartition("-")[2]


def find_kafka_home(configured: Path | None = None, cache: Path | None = None, record: Path | None = None) -> Path:
    """The Kafka installation to run: ``configured`` (``broker.kafka_home``, whose default is ``$KAFKA_HOME``) if
    given, else the one this environment recorded (:func:`record_kafka_home`), else the newest release in the cache.

    Raises:
        BrokerError: the configured folder is not a Kafka installation, or none is configured, recorded nor installed.
    """
    if configured is not None:
        try:
            installation_name(configured)
        except KafkaInstallError as exc:
            raise BrokerError(f"KAFKA_HOME: {exc}") from None
        return configured
    record = record or kafka_record_file()
    recorded = recorded_kafka_home(record)
    if recorded is not None:
        if _is_installation(recorded):
            return recorded
        log.warning("the Kafka installation recorded in %s, %s, is gone: looking in the cache", record, recorded)
    cache = cache or kafka_cache_dir()
    found = []
    for home in cache.glob("kafka*") if cache.is_dir() else []:
        try:
            found.append((_version_key(kafka_version(home)), home))
        except KafkaInstallError:
            continue
    if not found:
        raise BrokerError(
            "no Apache Kafka installation: set broker.kafka_home or KAFKA_HOME to one (a folder with libs/*.jar), "
            f"record one in {record} with `distrl-stream kafka use DIR` (as `make setup` does), "
            f"or run `distrl-stream kafka install` (into {cache})"
        )
    return max(found)[1]


def install_kafka(
    version: str = DEFAULT_KAFKA_VERSION,
    *,
    source: Path | None = None,
    checksum: Path | None = None,
    mirrors: Sequence[str] = APACHE_MIRRORS,
    cache: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Install a Kafka release into the cache and return its folder (a valid ``KAFKA_HOME``).

    Args:
        version: release to download (ignored with ``source``).
        source: a local release archive (``.tgz``) or an unpacked installation to copy, instead of downloading.
        checksum: a ``.sha512`` file for ``source``; by default ``<archive>.sha512`` is used when it exists.
        mirrors: base URLs tried in order; each must serve ``<version>/kafka_<scala>-<version>.tgz`` and ``.sha512``.
        cache: install location (default :func:`kafka_cache_dir`).
        force: replace an existing installation of the same release.
        progress: called with (bytes done, total) while downloading.

    Raises:
        KafkaInstallError: the download failed on every mirror, the checksum does not match, or the archive or
            folder is not a Kafka release.
    """
    cache = cache or kafka_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if source is None:
        target = cache / f"kafka_{SCALA_VERSION}-{version}"
        if _is_installation(target) and not force:
            return target
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            archive = _download_release(version, mirrors, Path(tmp), progress)
            return _unpack(archive, cache, force)
    if source.is_dir():
        target = cache / installation_name(source)
        if target.exists() and not force:
            return target
        with tempfile.TemporaryDirectory(dir=cache, prefix=".copy-") as tmp:
            staged = Path(tmp) / target.name
            shutil.copytree(source, staged, symlinks=False)
            return _move_into_place(staged, target, force)
    if not source.is_file():
        raise KafkaInstallError(f"--from {source}: no such file or folder")
    sidecar = source.with_name(source.name + ".sha512")
    checksum = checksum or (sidecar if sidecar.is_file() else None)
    if checksum is not None:
        verify_sha512(source, checksum.read_text())
    else:
        log.warning("no checksum for %s: not verified (give --sha512 FILE to verify)", source)
    return _unpack(source, cache, force)


def parse_sha512(text: str) -> str:
    """The hex digest in an Apache ``.sha512`` file.

    Accepts both forms Apache releases use: ``sha512sum`` output (``<hex>  <file>``) and ``gpg --print-md SHA512``
    output (``<file>: 1A2B 3C4D ...``, possibly over several lines).

    Raises:
        KafkaInstallError: no 128-digit hex digest in ``text``.
    """
    text = text.strip()
    candidates = [text.split()[0]] if text else []
    if ":" in text:
        candidates.append(re.sub(r"\s+", "", text.split(":", 1)[1]))
    for candidate in candidates:
        if re.fullmatch(r"[0-9a-fA-F]{128}", candidate):
            return candidate.lower()
    raise KafkaInstallError(f"not a SHA-512 checksum file: {text[:80]!r}")


def sha512_file(path: Path) -> str:
    """Hex SHA-512 of a file's bytes."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha512").hexdigest()


def verify_sha512(path: Path, checksum_text: str) -> None:
    """Check ``path`` against the contents of its ``.sha512`` file.

    Raises:
        KafkaInstallError: the digests differ (a corrupt or tampered file), or the checksum text is malformed.
    """
    expected = parse_sha512(checksum_text)
    actual = sha512_file(path)
    if actual != expected:
        raise KafkaInstallError(
            f"checksum mismatch for {path.name}: expected sha512 {expected[:16]}..., got {actual[:16]}... "
            "(corrupt or tampered archive; download it again)"
        )


def _download_release(version: str, mirrors: Sequence[str], into: Path, progress: Progress | None) -> Path:
    filename = f"kafka_{SCALA_VERSION}-{version}.tgz"
    failures = []
    for mirror in mirrors:
        url = f"{mirror.rstrip('/')}/{version}/{filename}"
        try:
            checksum_text = _fetch_text(url + ".sha512")
            archive = into / filename
            _fetch_file(url, archive, progress)
        except (urllib.error.URLError, OSError) as exc:
            failures.append(f"{url}: {exc}")
            continue
        verify_sha512(archive, checksum_text)
        return archive
    raise KafkaInstallError(f"could not download Kafka {version}: " + "; ".join(failures))


def _fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode("utf-8", "replace")


def _fetch_file(url: str, dest: Path, progress: Progress | None) -> None:
    with urllib.request.urlopen(url, timeout=60) as response, dest.open("wb") as out:
        length = response.headers.get("Content-Length")  # file:// responses have no .length
        total = int(length) if length else None
        done = 0
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)


def _unpack(archive: Path, cache: Path, force: bool) -> Path:
    with tempfile.TemporaryDirectory(dir=cache, prefix=".unpack-", ignore_cleanup_errors=True) as tmp:
        try:
            with tarfile.open(archive) as tar:
                # The "data" filter refuses absolute paths, links out of the tree and device files.
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise KafkaInstallError(f"{archive.name} is not a readable release archive: {exc}") from None
        entries = [p for p in Path(tmp).iterdir()]
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp)
        name = installation_name(root)
        return _move_into_place(root, cache / name, force)


def _move_into_place(staged: Path, target: Path, force: bool) -> Path:
    if target.exists():
        if not force:
            return target
        shutil.rmtree(target)
    staged.rename(target)
    return target


def _is_installation(home: Path) -> bool:
    try:
        installation_name(home)
    except KafkaInstallError:
        return False
    return True


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"[.\-]", version))
