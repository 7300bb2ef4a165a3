"""bench/learning.py's saved warm start: what --save-warm-start writes, what --warm-start refuses before it starts a
service or a learner, and the flags it cannot be given with (no services: a learner is never reached)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import learning
from distrl_stream.policy.pretrained import sha256_file

TEMPLATES = ["take_photo", "alarm_on"]
BASE_WEIGHTS = "a" * 64


def saved(tmp_path: Path) -> Path:
    """A warm start as a clone of this run would be saved: an adapter folder with one more file, and its recipe."""
    adapter = tmp_path / "clone"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"lora weights")
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["v", "q"]}))
    (adapter / "README.md").write_text("names this run's model path")
    recipe = {
        "scripted_noise": 0.3,
        "scripted_episodes": 300,
        "bc_updates": 120,
        "scripted_policy_success": 0.8,
        "templates": TEMPLATES,
        "base_weights_sha256": BASE_WEIGHTS,
        "warm_start_weights_sha256": sha256_file(adapter / "adapter_model.safetensors"),
        "adapter_shape": learning.adapter_shape(adapter),
    }
    learning.save_warm_start(learning.WarmStart(adapter, recipe), tmp_path / "saved")
    return tmp_path / "saved"


def base() -> dict[str, object]:
    return {"run": "bench-learning-x", "env": {"templates": TEMPLATES}, "learner": {}}


def test_a_saved_warm_start_is_the_adapter_s_weights_config_and_recipe(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    files = ["adapter_config.json", "adapter_model.safetensors", "recipe.json"]
    assert sorted(p.name for p in folder.iterdir()) == files
    assert (folder / "adapter_model.safetensors").read_bytes() == b"lora weights"
    recipe = json.loads((folder / "recipe.json").read_text())
    assert recipe["bc_updates"] == 120
    assert recipe["warm_start_weights_sha256"] == sha256_file(folder / "adapter_model.safetensors")


def test_a_saved_warm_start_s_recipe_is_read_back(tmp_path: Path) -> None:
    recipe = learning.read_warm_start(saved(tmp_path), TEMPLATES)
    assert (recipe["bc_updates"], recipe["base_weights_sha256"]) == (120, BASE_WEIGHTS)


def test_a_warm_start_cloned_on_other_templates_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--warm-start: cloned on the templates take_photo,alarm_on.*\(--templates\)"):
        learning.read_warm_start(saved(tmp_path), ["take_photo"])


def test_a_warm_start_cloned_on_another_tiny_model_is_refused(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    recipe = learning.read_warm_start(folder, TEMPLATES)
    with pytest.raises(SystemExit, match="tiny model whose weights differ from the one built here"):
        learning.load_warm_start(base(), folder, recipe, "b" * 64)


def test_an_adapter_that_is_not_the_recipe_s_is_refused(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    (folder / "adapter_model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="is not the adapter its recipe names"):
        learning.read_warm_start(folder, TEMPLATES)


def test_an_adapter_config_that_is_not_the_recipe_s_is_refused_by_field(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    config = json.loads((folder / "adapter_config.json").read_text())
    # Another order of the same modules, a path elsewhere: the same adapter.
    config.update(target_modules=["q", "v"], base_model_name_or_path="/elsewhere")
    (folder / "adapter_config.json").write_text(json.dumps(config))
    learning.read_warm_start(folder, TEMPLATES)
    (folder / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 32}))
    with pytest.raises(
        SystemExit, match=r"adapter_config\.json is not the one its recipe names \(lora_alpha 32 against 16\)"
    ):
        learning.read_warm_start(folder, TEMPLATES)


def test_a_folder_without_a_recipe_or_with_an_incomplete_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--warm-start: no readable recipe\.json"):
        learning.read_warm_start(tmp_path, TEMPLATES)
    folder = saved(tmp_path)
    recipe = json.loads((folder / "recipe.json").read_text())
    del recipe["base_weights_sha256"]
    (folder / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(SystemExit, match=r"recipe\.json lacks base_weights_sha256"):
        learning.read_warm_start(folder, TEMPLATES)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--warm-start", "w", "--bc-updates", "120"], "--bc-updates: the saved warm start's recipe sets it"),
        (["--warm-start", "w", "--noise", "0.5"], "--noise: the saved warm start's recipe sets it"),
        (["--model", "smollm2-135m-instruct", "--scripted-episodes", "9"], "--scripted-episodes: --model has no warm"),
        (["--model", "smollm2-135m-instruct", "--save-warm-start", "w"], "--save-warm-start: --model has no warm"),
    ],
)
def test_flags_a_warm_start_cannot_take_are_refused_by_name(
    flags: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["learning.py", "--out", "unused.json", *flags])
    with pytest.raises(SystemExit):
        learning.main()
    assert message in capsys.readouterr().err


def test_a_warm_start_of_other_templates_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = saved(tmp_path)
    argv = ["learning.py", "--out", str(tmp_path / "run.json"), "--warm-start", str(folder), "--templates", "alarm_on"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"\(--templates\)"):
        learning.main()
    assert not (tmp_path / "run.json").exists()
