"""Reads back what W&B wrote for an offline run: its run record and its history rows, from the ``.wandb`` file.

That file is a LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of records, each a 7-byte header --
CRC, length, type -- and a piece of a protobuf ``Record``) and W&B ships no reader for it.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7
_FULL, _LAST = 1, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pieces = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a record header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + _HEADER])
        pieces += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            yield pieces
            pieces = b""


def offline_runs(folder: Path, timeout_s: float = 30.0) -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    """Every offline run under ``folder`` (W&B's ``dir``): display name -> (its run record, its history rows).

    W&B's service may still be writing a finished run's file when ``finish`` returns (seen under load): each file is
    read again until it holds its exit record, within ``timeout_s``.
    """
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout_s
    runs = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        while True:
            run, rows, ended = None, [], False
            for data in _records(path):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(data)
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    run = record.run
                elif kind == "history":
                    items = record.history.item
                    rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
                ended = ended or kind == "exit"
            if ended:
                break
            assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
            time.sleep(0.2)
        assert run is not None, f"{path} has no run record"
        runs[run.display_name] = (run, rows)
    return runs
