"""Policy artifacts: the store of adapter versions on disk, their hash, atomic writes and weight-version events."""

from distrl_stream.artifacts.store import (
    adapter_dir,
    artifacts_dir,
    atomic_dir,
    dir_size,
    local_path,
    newest_artifact_version,
    remove_partial_dirs,
    sha256_dir,
    version_event,
)

__all__ = [
    "adapter_dir",
    "artifacts_dir",
    "atomic_dir",
    "dir_size",
    "local_path",
    "newest_artifact_version",
    "remove_partial_dirs",
    "sha256_dir",
    "version_event",
]
