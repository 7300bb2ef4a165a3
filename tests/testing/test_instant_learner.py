"""The no-op adapter of the stand-in learner: the learner's own LoRA shape, and the base model's behaviour."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from distrl_stream.config import ModelConfig
from distrl_stream.learner.trainer import load_policy, lora_config
from distrl_stream.testing.instant_learner import write_noop_adapter

_QWEN2_LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_noop_adapter_has_the_trainers_lora_shape_and_zero_b(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = ModelConfig(lora_rank=4, lora_alpha=8)
    out = write_noop_adapter(tiny_model_dir, tmp_path / "noop", model)

    written = json.loads((out / "adapter_config.json").read_text())
    expected = lora_config(model, AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert (written["r"], written["lora_alpha"], written["lora_dropout"]) == (4, 8, expected.lora_dropout)
    # all-linear, resolved from the architecture to the names vLLM serves LoRA on
    assert set(written["target_modules"]) == set(expected.target_modules) == _QWEN2_LINEAR
    weights = load_file(out / "adapter_model.safetensors")
    assert any("lora_B" in name for name in weights)
    assert all(not w.any() for name, w in weights.items() if "lora_B" in name)
    load_policy(tiny_model_dir, model, adapter=out)  # the learner accepts it as a warm start
