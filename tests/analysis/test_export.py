"""Export of replayed trajectories to Parquet and JSON Lines."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from distrl_stream.analysis.export import (
    EPISODE_SCHEMA,
    STEP_SCHEMA,
    SheetCounts,
    export_format,
    export_trajectories,
    images_folder,
    sheet_name,
    step_rows,
    write_contact_sheets,
)
from distrl_stream.analysis.replay import TrajectoryRecord
from distrl_stream.errors import ConfigError
from distrl_stream.events import Tensor
from distrl_stream.testing.samples import png, with_screenshots
from tests.analysis.helpers import make_record


def _records(n: int) -> list[TrajectoryRecord]:
    rng = random.Random(7)
    return [
        make_record(rng, offset=i, ended_min=i, versions=[i % 3] * (1 + i % 4), success=i % 2 == 0) for i in range(n)
    ]


def test_parquet_has_one_row_per_episode_with_its_facts(tmp_path: Path) -> None:
    records = _records(5)
    assert export_trajectories(records, tmp_path / "e.parquet") == 5
    table = pq.read_table(tmp_path / "e.parquet")
    assert table.schema.equals(EPISODE_SCHEMA)
    rows = table.to_pylist()
    assert [r["episode_id"] for r in rows] == [r.event.episode_id for r in records]
    assert [r["length"] for r in rows] == [len(r.event.steps) for r in records]
    assert [r["success"] for r in rows] == [True, False, True, False, True]
    assert rows[1]["ended_at"] == records[1].event.ended_at


def test_step_rows_keep_actions_and_token_logprobs(tmp_path: Path) -> None:
    records = _records(4)
    total_steps = sum(len(r.event.steps) for r in records)
    assert export_trajectories(records, tmp_path / "s.parquet", per="step") == total_steps
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.schema.equals(STEP_SCHEMA)
    first = table.to_pylist()[0]
    step = records[0].event.steps[0]
    assert first["action_text"] == step.action_text and first["step"] == 0
    assert (first["server"], first["adapter_sha256"]) == (step.server, step.adapter_sha256) != ("", None)
    np.testing.assert_allclose(first["token_logprobs"], step.token_logprobs.to_numpy())


def test_jsonl_rows_match_parquet_rows(tmp_path: Path) -> None:
    records = _records(3)
    export_trajectories(records, tmp_path / "s.jsonl", per="step")
    export_trajectories(records, tmp_path / "s.parquet", per="step")
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["episode_id"] for r in lines] == pq.read_table(tmp_path / "s.parquet").column("episode_id").to_pylist()
    assert lines[0]["candidates"] == list(records[0].event.steps[0].candidates)


def test_format_comes_from_the_suffix_or_the_flag() -> None:
    assert export_format(Path("x.parquet"), None) == "parquet"
    assert export_format(Path("x.jsonl"), None) == "jsonl"
    assert export_format(Path("x.data"), "jsonl") == "jsonl"
    with pytest.raises(ConfigError, match="--format"):
        export_format(Path("x.csv"), None)


def test_a_failed_export_leaves_no_file_behind(tmp_path: Path) -> None:
    def broken() -> Iterator[TrajectoryRecord]:
        yield from _records(2)
        raise RuntimeError("the read failed")

    with pytest.raises(RuntimeError):
        export_trajectories(broken(), tmp_path / "e.parquet")
    assert list(tmp_path.iterdir()) == []


def test_images_go_beside_the_export_one_sheet_per_episode_with_screenshots(tmp_path: Path) -> None:
    plain, shown, unsafe = _records(3)
    shown = dataclasses.replace(
        shown, event=with_screenshots(shown.event, [png((64, 64), (9, 9, 9))] * 2, tmp_path / "shots")
    )
    # An episode id names a file: one that reads as a path stays inside the folder.
    named = dataclasses.replace(shown.event, episode_id="../escape")
    unsafe = dataclasses.replace(unsafe, event=named)
    output = tmp_path / "out" / "run.parquet"
    folder = images_folder(output)
    assert folder == tmp_path / "out" / "run.images"
    counts = SheetCounts()
    assert export_trajectories(write_contact_sheets([plain, shown, unsafe], folder, counts), output) == 3
    assert (counts.episodes, counts.steps, counts.unreadable) == (2, 4, 0)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{shown.event.episode_id}.png", sheet_name("../escape")]
    )
    # An unsafe id keeps a digest of itself: two ids that read alike never share a file.
    assert sheet_name("../escape").startswith(".._escape-") and sheet_name("../escape") != sheet_name("..!escape")
    assert Image.open(folder / f"{shown.event.episode_id}.png").format == "PNG"


def test_step_rows_carry_the_prompt_token_ids_the_server_saw(tmp_path: Path) -> None:
    record = _records(1)[0]
    ids = [1, 9690, 198, 49151]
    steps = [dataclasses.replace(record.event.steps[0], prompt_token_ids=Tensor.from_token_ids(ids))]
    steps += [dataclasses.replace(s, prompt_token_ids=None) for s in record.event.steps[1:]]
    newer = dataclasses.replace(record, event=dataclasses.replace(record.event, steps=steps))
    export_trajectories([newer], tmp_path / "s.parquet", per="step")
    rows = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert rows[0]["prompt_token_ids"] == ids
    assert all(r["prompt_token_ids"] is None for r in rows[1:])  # written before the field existed


def test_step_rows_say_how_each_step_was_asked() -> None:
    record = _records(2)[1]  # two steps
    steps = [dataclasses.replace(record.event.steps[0], mode="free")]
    steps += [dataclasses.replace(s, mode=None) for s in record.event.steps[1:]]
    record = dataclasses.replace(record, event=dataclasses.replace(record.event, mode="choice", steps=steps))
    rows = list(step_rows(record))
    assert rows[0]["step_mode"] == "free"  # a choice episode's screen without candidates, asked in free mode
    assert all(r["step_mode"] == "choice" for r in rows[1:])  # a step without its own mode: the episode's
