"""The artifact store on disk: where a policy's adapter versions live (``{run_dir}/artifacts/<policy_id>/v<NNNNNN>``),
and the one definition of an adapter folder's sha256, of an atomic folder write, and of the weight-version event
that announces a finished adapter folder.

The learner hashes an adapter with :func:`sha256_dir` when it publishes a weight version and the inference
service hashes it again before loading it; both must agree byte for byte, so this is the only implementation.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from distrl_stream.config import Config, ModelConfig
from distrl_stream.errors import ArtifactError
from distrl_stream.events import WeightVersionEvent, utc_now

_CHUNK = 1 << 20
_VERSION_DIR = re.compile(r"^v(\d{6,})$")


def artifacts_dir(cfg: Config) -> Path:
    """Where the policy's adapter versions live: ``{run_dir}/artifacts/<policy_id>``."""
    return cfg.run_dir / "artifacts" / cfg.model.policy_id


def adapter_dir(cfg: Config, version: int) -> Path:
    """The artifact folder of one version: ``{run_dir}/artifacts/<policy_id>/v<NNNNNN>``."""
    return artifacts_dir(cfg) / f"v{version:06d}"


def newest_artifact_version(cfg: Config) -> int:
    """The highest version with a complete adapter folder in the artifact store (0 when none)."""
    root = artifacts_dir(cfg)
    if not root.is_dir():
        return 0
    found = [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _VERSION_DIR.match(p.name))]
    return max(found, default=0)


def prune_artifacts(cfg: Config, newest: int) -> list[int]:
    """Remove the adapter folders of versions older than the newest ``artifacts.keep_versions`` once ``newest`` is
    published, as ``{run}.artifacts``'s compaction does for the chunks (docs/design.md §3).

    What stays is what may still be read: the versions a server may yet fetch (``inference.keep_versions`` is at most
    ``artifacts.keep_versions``, checked at load) and the newest, which numbers the next version after a restart
    (:func:`newest_artifact_version`); a checkpoint holds its own copy of the adapter. Each folder is renamed away
    first, so a reader sees it whole or not at all (a ``file://`` fetch of it then fails as ``missing``).

    Returns:
        The versions removed, oldest first.

    Raises:
        OSError: a folder could not be renamed away.
    """
    root = artifacts_dir(cfg)
    oldest_kept = newest - cfg.artifacts.keep_versions + 1
    old = sorted(
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else ())
        if p.is_dir() and (m := _VERSION_DIR.match(p.name)) and int(m.group(1)) < oldest_kept
    )
    for _version, folder in old:
        doomed = folder.with_name(f".{folder.name}.pruned.tmp")
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return [version for version, _folder in old]


def sha256_dir(path: Path) -> str:
    """Hex sha256 over a folder's regular files: for each file in sorted relative-path order (POSIX separators),
    the path's UTF-8 bytes, a NUL, the file's size as 8 big-endian bytes, then the file's bytes.

    The path and length prefixes make the digest unambiguous: renaming a file, or moving bytes from one file to the
    next, changes it. Symlinks and empty folders are not part of an adapter and are rejected / ignored.

    Raises:
        ArtifactError: the folder does not exist or contains a symlink.
    """
    if not path.is_dir():
        raise ArtifactError(f"not a folder: {path}")
    files: list[tuple[str, Path]] = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = Path(root) / name
            if full.is_symlink():
                raise ArtifactError(f"symlink in artifact folder (not allowed): {full}")
            files.append((full.relative_to(path).as_posix(), full))
    return _sha256_files(files)


def _sha256_files(files: list[tuple[str, Path]]) -> str:
    digest = hashlib.sha256()
    for rel, full in sorted(files):
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(full.stat().st_size.to_bytes(8, "big"))
        with full.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def model_fingerprint(model_dir: Path, cache_file: Path | None = None) -> str:
    """The base model's fingerprint: :func:`sha256_dir`'s digest over only ``config.json`` and the weight files
    (``*.safetensors``, ``*.bin``) at the top of ``model_dir``.

    Those files decide what an adapter is applied to; tokenizer and generation files do not change the weights, so
    they are left out. Hashing a multi-GB model takes a while, so the digest is cached in ``cache_file`` (JSON)
    under the folder's path and each file's size and mtime: an unchanged folder is not read again.

    Raises:
        ArtifactError: ``model_dir`` has no ``config.json``.
    """
    if not (model_dir / "config.json").is_file():
        raise ArtifactError(f"not a model folder (no config.json): {model_dir}")
    files = sorted(
        (p.name, p)
        for p in model_dir.iterdir()
        if p.is_file() and (p.name == "config.json" or p.suffix in (".safetensors", ".bin"))
    )
    key = str(model_dir.resolve())
    stamp = [[rel, p.stat().st_size, p.stat().st_mtime_ns] for rel, p in files]
    cached: dict[str, dict[str, object]] = {}
    if cache_file is not None and cache_file.is_file():
        try:
            cached = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cached = {}  # a damaged cache only costs a re-hash
        entry = cached.get(key)
        if entry is not None and entry.get("files") == stamp:
            return str(entry["sha256"])
    digest = _sha256_files(files)
    if cache_file is not None:
        cached[key] = {"files": stamp, "sha256": digest}
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached))
        os.replace(tmp, cache_file)
    return digest


def base_fingerprint(cfg: Config, model_dir: Path) -> str:
    """:func:`model_fingerprint` of ``model_dir``, cached in ``{data_dir}/models/fingerprints.json``."""
    return model_fingerprint(model_dir, cfg.data_dir / "models" / "fingerprints.json")


def dir_size(path: Path) -> int:
    """Total bytes of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def version_event(
    model: ModelConfig,
    version: int,
    adapter: Path,
    *,
    adapter_uri: str,
    base_fingerprint: str,
    learner_step: int,
    trajectories_consumed: int,
    metrics: dict[str, float] | None = None,
) -> WeightVersionEvent:
    """The event announcing ``adapter`` (complete on disk, published at ``adapter_uri``) as ``version`` of
    ``model.policy_id``: URI, sha256, size and the base model's fingerprint (:func:`model_fingerprint`)."""
    return WeightVersionEvent(
        policy_id=model.policy_id,
        version=version,
        base_model=model.base_model_id,
        adapter_uri=adapter_uri,
        sha256=sha256_dir(adapter),
        size_bytes=dir_size(adapter),
        created_at=utc_now(),
        learner_step=learner_step,
        trajectories_consumed=trajectories_consumed,
        metrics=metrics or {},
        base_fingerprint=base_fingerprint,
    )


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Write a folder so readers see either nothing or all of it.

    Yields a temporary folder beside ``target`` (same filesystem, so the final rename is atomic); on a clean exit
    every file is fsynced, the folder is renamed to ``target`` and the parent is fsynced. On an exception the
    temporary folder is removed and ``target`` is untouched.

    Raises:
        ArtifactError: ``target`` already exists.
    """
    if target.exists():
        raise ArtifactError(f"refusing to overwrite existing artifact folder {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                _fsync(file, os.O_RDONLY)
        _fsync(tmp, os.O_RDONLY)
        os.rename(tmp, target)
        _fsync(target.parent, os.O_RDONLY)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_partial_dirs(parent: Path) -> None:
    """Remove the temporary folders :func:`atomic_dir` left in ``parent`` when its process was killed mid-write.

    Only for a folder with a single writer: another process's write in progress there would be removed too.
    """
    if parent.is_dir():
        for p in parent.iterdir():
            if p.is_dir() and p.name.startswith(".") and p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)


def local_path(uri: str) -> Path:
    """The local folder an artifact URI names: ``file:///abs/path`` or a plain path.

    Raises:
        ArtifactError: another scheme (a remote store needs a downloader that is not configured).
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    raise ArtifactError(f"unsupported artifact URI scheme {parsed.scheme!r} in {uri!r} (only file:// or a path)")


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
