"""Pretrained models from pinned PyPI packages: the registry, the sha256 check, the conversion, idempotence."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.config import load_config
from distrl_stream.errors import ModelBuildError
from distrl_stream.policy import pretrained
from distrl_stream.policy.model_dir import load_prompter, resolve_model_dir
from distrl_stream.policy.pretrained import PRETRAINED, is_pulled, provenance, pull, sha256_file

NAME = "smollm2-135m-instruct"


def test_the_pulled_folder_is_a_pretrained_instruct_model_with_its_provenance(smollm2_dir: Path) -> None:
    spec = PRETRAINED[NAME]
    record = provenance(smollm2_dir)
    assert record is not None
    assert (record["package"], record["version"], record["sha256"]) == (spec.package, spec.version, spec.sha256)
    assert record["note"] == "dequantised from Q4_1"
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # plain tensors: vLLM and transformers load them as any folder
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("llama", 576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (9, 3, 49152)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    # Pretrained, not random: greedy decoding answers a factual question.
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, len(ids) :])


def test_pulling_again_leaves_the_folder_alone(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = smollm2_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def no_conversion(*_args: object) -> None:
        raise AssertionError("a pulled folder was converted again")

    monkeypatch.setattr(pretrained, "_convert_gguf", no_conversion)
    assert pull(NAME, smollm2_dir) == smollm2_dir
    assert weights.stat().st_mtime_ns == mtime


def test_a_file_whose_sha256_differs_from_the_registry_is_refused(
    tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forged = dataclasses.replace(PRETRAINED[NAME], sha256="0" * 64)
    monkeypatch.setitem(PRETRAINED, "forged", forged)
    with pytest.raises(ModelBuildError, match="differs from the pinned"):
        pull("forged", tmp_path / "forged")
    assert not (tmp_path / "forged").exists()
    # The real entry's folder is not a pull of the forged one.
    assert not is_pulled("forged", smollm2_dir)


def test_unknown_names_and_foreign_folders_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelBuildError, match=f"unknown pretrained model 'nope'; known: {NAME}"):
        pull("nope", tmp_path / "x")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "weights.bin").write_bytes(b"mine")
    with pytest.raises(ModelBuildError, match="is not a pull of"):
        pull(NAME, occupied)
    assert (occupied / "weights.bin").read_bytes() == b"mine"


def test_model_base_takes_a_registry_name_or_a_folder(tmp_path: Path, smollm2_dir: Path) -> None:
    by_folder = load_config(model={"base": smollm2_dir})
    assert resolve_model_dir(by_folder) == smollm2_dir
    assert load_prompter(by_folder).format == "chat"
    # A name that is not a folder here is pulled into the run's data dir; a copy of the pull stands in for it.
    data_dir = tmp_path / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / NAME).symlink_to(smollm2_dir)
    by_name = load_config(data_dir=data_dir, model={"base": NAME})
    assert resolve_model_dir(by_name) == data_dir / "models" / NAME
    assert by_name.model.base_model_id == NAME
    assert load_prompter(load_config(data_dir=data_dir)).format == "raw"  # the local tiny model


def test_pulls_at_once_convert_once_and_all_find_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not really a model")
    monkeypatch.setitem(PRETRAINED, "fake", dataclasses.replace(PRETRAINED[NAME], sha256=sha256_file(gguf)))
    monkeypatch.setattr(pretrained, "_package_file", lambda _spec, install: gguf)
    conversions = []

    def convert(_source: Path, out: Path, _dtype: str) -> None:
        conversions.append(out)
        time.sleep(0.3)  # long enough for the other pulls to arrive while this one converts
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(pretrained, "_convert_gguf", convert)
    target = tmp_path / "models" / "fake"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: pull("fake", target), range(4)))
    assert results == [target] * 4 and len(conversions) == 1
    assert is_pulled("fake", target)
