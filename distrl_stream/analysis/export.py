"""Export replayed trajectories to Parquet or JSON Lines, one row per episode or one row per step.

Rows are written in batches as they are read, so an export of a long run never holds the run in memory. Both formats
have the same columns (:data:`EPISODE_SCHEMA`, :data:`STEP_SCHEMA`); times are UTC (Parquet ``timestamp[ms, UTC]``,
JSONL ISO 8601 strings), per-token tensors become lists. With images, each episode that has screenshots also gets a
contact sheet (:func:`write_contact_sheets`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from distrl_stream.analysis.contact_sheet import contact_sheet
from distrl_stream.analysis.replay import TrajectoryRecord
from distrl_stream.errors import ConfigError

Granularity = Literal["episode", "step"]
ExportFormat = Literal["parquet", "jsonl"]

_TS = pa.timestamp("ms", tz="UTC")
_BATCH_ROWS = 512
# What may not appear in a contact sheet's file name, which comes from a record's episode id.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

_EPISODE_KEYS: list[tuple[str, pa.DataType]] = [
    ("run", pa.string()),
    ("episode_id", pa.string()),
    ("collector_id", pa.string()),
    ("env_kind", pa.string()),
    ("task_id", pa.string()),
    ("task_template", pa.string()),
    ("instruction", pa.string()),
    ("split", pa.string()),
    ("mode", pa.string()),
]

EPISODE_SCHEMA = pa.schema(
    [
        *_EPISODE_KEYS,
        ("base_model", pa.string()),
        ("base_fingerprint", pa.string()),
        ("started_at", _TS),
        ("ended_at", _TS),
        ("duration_s", pa.float64()),
        ("termination", pa.string()),
        ("success", pa.bool_()),
        ("total_reward", pa.float64()),
        ("length", pa.int32()),
        ("invalid_steps", pa.int32()),
        ("min_policy_version", pa.int64()),
        ("max_policy_version", pa.int64()),
        ("mean_inference_latency_s", pa.float64()),
        ("mean_env_latency_s", pa.float64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_timestamp", _TS),
    ]
)
"""Columns of a per-episode export."""

STEP_SCHEMA = pa.schema(
    [
        *_EPISODE_KEYS,
        ("episode_success", pa.bool_()),
        ("step", pa.int32()),
        ("step_mode", pa.string()),
        ("observation", pa.string()),
        ("screenshot_uri", pa.string()),
        ("screenshot_sha256", pa.string()),
        ("candidates", pa.list_(pa.string())),
        ("action_text", pa.string()),
        ("action", pa.string()),
        ("valid", pa.bool_()),
        ("invalid_reason", pa.string()),
        ("reward", pa.float64()),
        ("done", pa.bool_()),
        ("behaviour_logprob", pa.float64()),
        ("token_ids", pa.list_(pa.int32())),
        ("token_logprobs", pa.list_(pa.float32())),
        ("policy_version", pa.int64()),
        ("inference_latency_s", pa.float64()),
        ("env_latency_s", pa.float64()),
        ("server", pa.string()),
        ("adapter_sha256", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)
"""Columns of a per-step export."""


def export_format(path: Path, fmt: ExportFormat | None) -> ExportFormat:
    """The format to write: ``fmt`` if given, else from the file suffix (.parquet/.pq, .jsonl/.ndjson/.json).

    Raises:
        ConfigError: no format given and the suffix names none.
    """
    if fmt is not None:
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise ConfigError("--format", f"cannot tell the format of {path.name}: use parquet or jsonl (or name it .parquet)")


def episode_row(record: TrajectoryRecord) -> dict[str, Any]:
    """One row of a per-episode export."""
    e = record.event
    versions = [s.policy_version for s in e.steps]
    return {
        **_keys(record),
        "base_model": e.base_model,
        "base_fingerprint": e.base_fingerprint,
        "started_at": e.started_at,
        "ended_at": e.ended_at,
        "duration_s": (e.ended_at - e.started_at).total_seconds(),
        "termination": str(e.termination),
        "success": e.success,
        "total_reward": e.total_reward,
        "length": len(e.steps),
        "invalid_steps": sum(not s.valid for s in e.steps),
        "min_policy_version": min(versions, default=0),
        "max_policy_version": max(versions, default=0),
        "mean_inference_latency_s": _mean([s.inference_latency_s for s in e.steps]),
        "mean_env_latency_s": _mean([s.env_latency_s for s in e.steps]),
        "partition": record.partition,
        "offset": record.offset,
        "kafka_timestamp": record.timestamp,
    }


def step_rows(record: TrajectoryRecord) -> Iterator[dict[str, Any]]:
    """The rows of a per-step export for one episode."""
    keys = _keys(record)
    for i, s in enumerate(record.event.steps):
        yield {
            **keys,
            "episode_success": record.event.success,
            "step": i,
            "step_mode": s.mode or record.event.mode,  # how the step was asked (v4; before it, the episode's mode)
            "observation": s.observation,
            "screenshot_uri": s.screenshot_uri,
            "screenshot_sha256": s.screenshot_sha256,
            "candidates": list(s.candidates),
            "action_text": s.action_text,
            "action": s.action,
            "valid": s.valid,
            "invalid_reason": s.invalid_reason,
            "reward": s.reward,
            "done": s.done,
            "behaviour_logprob": s.behaviour_logprob,
            "token_ids": s.token_ids.to_numpy().astype(np.int32).tolist(),
            "token_logprobs": s.token_logprobs.to_numpy().astype(np.float32).tolist(),
            "policy_version": s.policy_version,
            "inference_latency_s": s.inference_latency_s,
            "env_latency_s": s.env_latency_s,
            "server": s.server,
            "adapter_sha256": s.adapter_sha256,
            "prompt_token_ids": None
            if s.prompt_token_ids is None
            else s.prompt_token_ids.to_numpy().astype(np.int32).tolist(),
            "partition": record.partition,
            "offset": record.offset,
        }


def export_trajectories(
    records: Iterable[TrajectoryRecord], path: Path, *, per: Granularity = "episode", fmt: ExportFormat | None = None
) -> int:
    """Write ``records`` to ``path`` (parent folders created); returns the number of rows written.

    Args:
        records: replayed trajectories (e.g. from :func:`~distrl_stream.analysis.replay.read_trajectories`).
        path: output file; written to ``path.partial`` first and renamed at the end, so a failed export never
            leaves a truncated file under the final name.
        per: ``episode`` (one row per trajectory) or ``step`` (one row per step).
        fmt: ``parquet`` or ``jsonl``; None infers it from the suffix.
    """
    fmt = export_format(path, fmt)
    schema = EPISODE_SCHEMA if per == "episode" else STEP_SCHEMA
    rows = (episode_row(r) for r in records) if per == "episode" else (row for r in records for row in step_rows(r))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    written = 0
    try:
        if fmt == "parquet":
            with pq.ParquetWriter(partial, schema, compression="zstd") as writer:
                for batch in _batches(rows):
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    written += len(batch)
        else:
            with partial.open("w", encoding="utf-8") as fh:
                for batch in _batches(rows):
                    _write_jsonl(fh, batch)
                    written += len(batch)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return written


@dataclass
class SheetCounts:
    """What :func:`write_contact_sheets` drew.

    Attributes:
        episodes: contact sheets written (episodes with at least one screenshot).
        steps: tiles on them (steps with a screenshot).
        unreadable: tiles that are placeholders: the screenshot was missing, unreadable, altered or not an image.
    """

    episodes: int = 0
    steps: int = 0
    unreadable: int = 0


def images_folder(path: Path) -> Path:
    """Where the contact sheets of an export to ``path`` go: ``STEM.images`` beside it (``runs/x.parquet`` ->
    ``runs/x.images``)."""
    return path.with_name(f"{path.stem}.images")


def sheet_name(episode_id: str) -> str:
    """The contact sheet's file name: the episode id, or for an id that is not a safe file name, the id with its
    unsafe characters replaced and a digest of the whole id (two such ids never share a file)."""
    safe = _UNSAFE.sub("_", episode_id)
    if safe == episode_id:
        return f"{safe}.png"
    return f"{safe}-{hashlib.sha256(episode_id.encode()).hexdigest()[:8]}.png"


def write_contact_sheets(
    records: Iterable[TrajectoryRecord], folder: Path, counts: SheetCounts
) -> Iterator[TrajectoryRecord]:
    """Pass ``records`` through, writing each one's contact sheet on the way (when it has screenshots).

    A sheet goes to ``folder/EPISODE_ID.png`` (characters other than letters, digits, ``.``, ``_`` and ``-`` become
    ``_``: the id comes from the topic, and must not name a path), written to a temporary name and renamed, and is
    counted in ``counts``. A screenshot that cannot be read becomes a placeholder tile, never an error.
    """
    for record in records:
        sheet = contact_sheet(record.event)
        if sheet is not None:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / sheet_name(record.event.episode_id)
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(sheet.png())
            partial.replace(path)
            counts.episodes += 1
            counts.steps += sheet.steps
            counts.unreadable += sheet.unreadable
        yield record


def _keys(record: TrajectoryRecord) -> dict[str, Any]:
    e = record.event
    return {name: getattr(e, name) for name, _ in _EPISODE_KEYS}


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= _BATCH_ROWS:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_jsonl(fh: IO[str], batch: list[dict[str, Any]]) -> None:
    for row in batch:
        fh.write(json.dumps(row, default=_json_default, ensure_ascii=False))
        fh.write("\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0
