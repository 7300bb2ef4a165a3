"""Weights & Biases tracking in W&B's offline mode (no network): the run files read back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distrl_stream.config import Config, load_config
from distrl_stream.errors import ConfigError
from distrl_stream.monitor.wandb import tracker
from tests.monitor.wandb_files import offline_runs


def offline(tmp_path: Path, **sections: object) -> Config:
    monitor = {"wandb_project": "distrl-test", "wandb_mode": "offline", "wandb_dir": tmp_path}
    return load_config(run="wb", monitor=monitor, **sections)


def test_no_project_tracks_nothing() -> None:
    assert tracker(load_config(), "learner", "0") is None


def test_a_project_without_the_package_is_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    with pytest.raises(ConfigError, match=r"^monitor\.wandb_project: needs the wandb package"):
        tracker(offline(tmp_path), "learner", "0")


def test_an_offline_run_holds_the_values_at_their_steps_grouped_by_the_run_with_secrets_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = offline(tmp_path, kafka={"client": {"sasl.password": "hunter2"}})
    tracked = tracker(cfg, "collector", "c-1")
    assert tracked is not None
    tracked.log("collector", {"episodes": 1.0}, step=1)
    tracked.log("collector", {"episodes": 3.0, "success_rate": 0.5}, step=2)
    tracked.close()
    [(name, (run, rows))] = offline_runs(tmp_path).items()
    assert name == "wb-c-1" and run.project == "distrl-test" and run.run_group == "wb" and run.job_type == "collector"
    assert [(r["_step"], r["collector/episodes"]) for r in rows] == [(1, 1.0), (2, 3.0)]
    assert rows[1]["collector/success_rate"] == 0.5
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["kafka"]["client"]["sasl.password"] == "**********" and config["run"] == "wb"
    assert not any(b"hunter2" in path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())
