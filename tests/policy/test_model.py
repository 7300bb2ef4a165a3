"""Local policy models: deterministic, loadable by transformers, the shapes vLLM's CPU build accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from distrl_stream.artifacts import sha256_dir
from distrl_stream.cli.main import app
from distrl_stream.errors import ModelBuildError
from distrl_stream.policy.model import build_model, count_parameters

ACTION = '{"action_type":"click","index":3}'


def test_tiny_model_loads_in_transformers_with_head_dim_64(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # vLLM's CPU attention rejects 16
    assert 0.2e6 <= count_parameters(tiny_model_dir) <= 0.6e6
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tokenizer(ACTION)["input_ids"]
    assert tokenizer.decode(ids) == ACTION
    assert len(ids) < len(ACTION) / 2  # the BPE merges learned the action vocabulary
    assert tokenizer.eos_token_id == model.config.eos_token_id == model.generation_config.eos_token_id
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)


def test_cli_build_is_deterministic_and_refuses_to_overwrite(tiny_model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["model", "init", str(tmp_path / "m"), "--size", "tiny"])
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output
    assert sha256_dir(tmp_path / "m") == sha256_dir(tiny_model_dir)  # same size and seed: identical files
    again = runner.invoke(app, ["model", "init", str(tmp_path / "m")])
    assert again.exit_code == 1
    assert "already exists" in again.output


def test_seed_changes_the_weights_not_the_tokenizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    other = build_model(tmp_path / "seed1", "tiny", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny_model_dir / "model.safetensors").read_bytes()


def test_small_model_has_5_to_20_million_parameters(tmp_path: Path) -> None:
    out = build_model(tmp_path / "small", "small")
    assert 5e6 <= count_parameters(out) <= 20e6


def test_unknown_size_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ModelBuildError, match="unknown model size 'huge'"):
        build_model(tmp_path / "x", "huge")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()
