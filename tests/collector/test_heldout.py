"""The eval command's library: which versions a --versions text names, the episodes of a plan, the model's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distrl_stream.collector.heldout import EvalPlan, model_name, parse_versions
from distrl_stream.config import load_config
from distrl_stream.errors import ConfigError
from distrl_stream.policy.pretrained import PROVENANCE_FILE


@pytest.mark.parametrize(
    ("text", "versions"),
    [
        ("0", [0]),
        ("latest", [5]),
        ("2-4", [2, 3, 4]),
        ("3-latest", [3, 4, 5]),
        ("0,2-3,latest", [0, 2, 3, 5]),
        (" 4 , 1-2,4 ", [1, 2, 4]),  # spaces allowed, repeats evaluated once, ascending
        ("0-2", [0, 1, 2]),
    ],
)
def test_versions_text_names_published_versions_in_ascending_order(text: str, versions: list[int]) -> None:
    assert parse_versions(text, [1, 2, 3, 4, 5]) == versions


@pytest.mark.parametrize(
    ("text", "published", "message"),
    [
        ("7", [1, 2], "--versions: version 7 was never published (published: 1-2)"),
        ("1-4", [1, 2, 4], "--versions: version 3 was never published (published: 1-2, 4)"),
        ("5-2", [1, 2, 3, 4, 5], "--versions: '5-2': a range runs from the lower version to the higher"),
        ("two", [1], "--versions: 'two': expected a version number, latest, or a range A-B (e.g. 0,2-5,latest)"),
        ("1-", [1], "--versions: '1-': expected a version number, latest, or a range A-B (e.g. 0,2-5,latest)"),
        ("-1", [1], "--versions: '-1': expected a version number, latest, or a range A-B (e.g. 0,2-5,latest)"),
        ("1,,2", [1, 2], "--versions: '': expected a version number, latest, or a range A-B (e.g. 0,2-5,latest)"),
        ("latest", [], "--versions: 'latest': no version published yet, only 0 (the base model)"),
        ("1", [], "--versions: version 1 was never published (none published yet)"),
    ],
)
def test_a_bad_versions_text_is_one_line_naming_the_flag(text: str, published: list[int], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_versions(text, published)
    assert str(caught.value) == message and "\n" not in message


def test_a_plan_runs_each_of_the_splits_first_tasks_its_episodes_in_a_row() -> None:
    cfg = load_config(None, env={"templates": ["take_photo", "alarm_on"]})
    plan = EvalPlan(split="train", tasks=3, episodes_per_task=2)
    episodes = plan.task_list(cfg)
    ids = [task.id for task in episodes]
    assert len(episodes) == 6 and ids[0::2] == ids[1::2] and len(set(ids)) == 3
    assert {task.split for task in episodes} == {"train"}
    assert plan.task_list(cfg) == episodes  # the same tasks every time


def test_a_report_names_a_pulled_model_by_its_registry_name_and_any_other_by_its_folder(tmp_path: Path) -> None:
    pulled, own = tmp_path / "models" / "smollm2-135m-instruct", tmp_path / "my-model"
    pulled.mkdir(parents=True)
    own.mkdir()
    (pulled / PROVENANCE_FILE).write_text(json.dumps({"name": "smollm2-135m-instruct", "sha256": "0" * 64}))
    assert model_name(load_config(None, model={"base": str(pulled)})) == "smollm2-135m-instruct"
    assert model_name(load_config(None, model={"base": str(own)})) == str(own)
    assert model_name(load_config(None, model={"size": "tiny"})) == "tiny"
