"""Policy artifacts: the store of adapter versions on disk, their hash, atomic writes, weight-version events, the
base model's fingerprint, and the transport (publish / fetch) of adapter folders over kafka://, file:// and fsspec."""

from distrl_stream.artifacts.store import (
    adapter_dir,
    artifacts_dir,
    atomic_dir,
    base_fingerprint,
    dir_size,
    local_path,
    model_fingerprint,
    newest_artifact_version,
    prune_artifacts,
    remove_partial_dirs,
    sha256_dir,
    version_event,
)
from distrl_stream.artifacts.transport import fetch, publish

__all__ = [
    "adapter_dir",
    "artifacts_dir",
    "atomic_dir",
    "base_fingerprint",
    "dir_size",
    "fetch",
    "local_path",
    "model_fingerprint",
    "newest_artifact_version",
    "prune_artifacts",
    "publish",
    "remove_partial_dirs",
    "sha256_dir",
    "version_event",
]
