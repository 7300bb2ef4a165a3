"""Learner checkpoints and the ingest log: what makes a restart lose nothing and repeat nothing.

A checkpoint is the learner group's (one policy, however many members): one folder ``ckpt-<seq>`` under
``{run_dir}/learner/checkpoints``, written by rank 0 alone, whole into a temporary folder, fsynced and renamed
(``artifacts.atomic_dir``), so a crash at any moment leaves either the previous checkpoint or the new one, never half
of one. It holds:

- ``adapter/``: the LoRA adapter (peft format);
- ``trainer.pt``: critics, optimisers, update counter, torch random state;
- ``state.json``: gathered from every member: per partition the consumed offset (``offsets``) and the replay shard
  that was held of it (``shards``: its first offset and the priority of every held record, keyed by offset), the
  held episodes loaded with ``--from-replay`` (``replayed``: source topic -> partition -> offset -> priority), the
  length of every member's ingest log, the version counter and the counters.

The replay buffer itself is not saved: the topics are the replay store. A restarted member re-reads the replayed
episodes from their source topics before it starts, then rebuilds its shard by re-reading the shard's offset range of
the partitions it is assigned (:mod:`.ingest`); the group updates (and so checkpoints) only once that is done.

The **ingest log** (``{run_dir}/learner/<member>/ingested.log``) is the auditable record of every trajectory record a
member used, one line per record: partition, offset, episode id, what happened to it (``ingested`` into the buffer,
``stale``, ``incomplete``, ``dead``). It is append-only; each checkpoint records its byte length after an fsync, and a
restart truncates every member's log to the length the checkpoint it resumes from recorded, so the logs and the
checkpoint always agree: every offset below a checkpoint's offsets appears exactly once over all the logs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from distrl_stream.artifacts import atomic_dir, remove_partial_dirs
from distrl_stream.errors import CheckpointError

CHECKPOINT_FORMAT = 2
_NAME = re.compile(r"^ckpt-(\d{8})$")


def learner_dir(run_dir: Path, member_id: str) -> Path:
    """Files of one learner member (its ingest log and lock): ``{run_dir}/learner/<member>``."""
    return run_dir / "learner" / member_id


def checkpoints_dir(run_dir: Path) -> Path:
    """The learner group's checkpoints: ``{run_dir}/learner/checkpoints``."""
    return run_dir / "learner" / "checkpoints"


def member_logs(run_dir: Path) -> dict[str, Path]:
    """Member id -> ingest log, for every member folder of the run (also of members that are gone)."""
    root = run_dir / "learner"
    if not root.is_dir():
        return {}
    return {d.name: d / "ingested.log" for d in sorted(root.iterdir()) if d.is_dir() and d.name != "checkpoints"}


class CheckpointStore:
    """Atomic, numbered checkpoint folders; the newest ``keep`` are kept.

    Args:
        root: the folder that holds the ``ckpt-<seq>`` folders.
        keep: how many checkpoints to keep (older ones are deleted after a new one is complete).
    """

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = root
        self.keep = keep

    def all(self) -> list[Path]:
        """Complete checkpoints, oldest first (temporary folders of an interrupted write are not listed)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name))

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.all()
        return found[-1] if found else None

    def save(self, write: Callable[[Path], None]) -> Path:
        """Write a new checkpoint: ``write(folder)`` fills a temporary folder that becomes ``ckpt-<seq>`` atomically.

        Returns:
            The new checkpoint folder.
        """
        latest = self.latest()
        seq = int(_NAME.match(latest.name).group(1)) + 1 if latest is not None else 1  # type: ignore[union-attr]
        target = self.root / f"ckpt-{seq:08d}"
        remove_partial_dirs(self.root)  # left only by a process killed mid-write; rank 0 (locked) owns this folder
        with atomic_dir(target) as tmp:
            write(tmp)
        for old in self.all()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target


def write_json(path: Path, data: Any) -> None:
    """Write JSON (compact; the buffer can be large)."""
    with path.open("w") as fh:
        json.dump(data, fh, separators=(",", ":"))


def read_json(path: Path) -> Any:
    """Read a checkpoint's JSON part.

    Raises:
        CheckpointError: missing or malformed.
    """
    try:
        with path.open() as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint part {path} is missing or malformed: {exc}") from None


@dataclass(frozen=True, slots=True)
class IngestRecord:
    """One line of the ingest log."""

    partition: int
    offset: int
    episode_id: str
    status: str


class IngestLog:
    """The append-only ingest log (see the module docstring). Not thread-safe: the trainer thread owns it.

    Args:
        path: the log file (created on first append).
    """

    STATUSES = ("ingested", "stale", "incomplete", "dead", "rejected")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None

    def append(self, partition: int, offset: int, episode_id: str, status: str) -> None:
        """Record what happened to one trajectory record."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        # Episode ids are keys chosen by producers: keep them on one line whatever they contain.
        safe_id = episode_id.replace("\t", " ").replace("\n", " ")
        self._fh.write(f"{partition}\t{offset}\t{safe_id}\t{status}\n")

    def sync(self) -> int:
        """Flush and fsync; returns the log's length in bytes (what a checkpoint records)."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, size: int) -> None:
        """Cut the log back to ``size`` bytes: the records after a checkpoint are re-read after a restart.

        Raises:
            CheckpointError: the log is shorter than the checkpoint says (it was lost or edited).
        """
        self.close()
        current = self.path.stat().st_size if self.path.exists() else 0
        if current < size:
            raise CheckpointError(f"ingest log {self.path} has {current} bytes, the checkpoint recorded {size}")
        if current > size:
            with self.path.open("r+b") as fh:
                fh.truncate(size)
                os.fsync(fh.fileno())

    def close(self) -> None:
        """Flush and close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    @staticmethod
    def read(path: Path) -> list[IngestRecord]:
        """All records of a log file, in order (for audits and tests)."""
        if not path.exists():
            return []
        out = []
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                partition, offset, episode_id, status = line.rstrip("\n").split("\t")
                out.append(IngestRecord(int(partition), int(offset), episode_id, status))
        return out
