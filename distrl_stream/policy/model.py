"""Local policy models: a byte-level BPE tokenizer and a Qwen2 causal LM built from a config, no hub download.

The folder written by :func:`build_model` holds what ``save_pretrained`` writes for the model, the tokenizer and
the generation config, so transformers (``AutoModelForCausalLM.from_pretrained``) and vLLM (``--model DIR``) both
load it. Building is seeded and deterministic: the same size, corpus and seed give byte-identical files.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from distrl_stream.artifacts import atomic_dir
from distrl_stream.errors import ModelBuildError
from distrl_stream.policy.prompt import build_prompt
from distrl_stream.policy.vision import VISION_SPECS, build_vision_model, is_vision_model

EOS_TOKEN = "<|endoftext|>"

ModelSize = Literal["tiny", "small", "tiny-vl"]


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a locally built Qwen2 model. ``head_dim`` = hidden / heads is 64: vLLM's CPU attention rejects 16."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int = 1024


SPECS: dict[str, ModelSpec] = {
    # ≈0.33M parameters (0.13M of them the tied embedding): tests and the CPU demo.
    "tiny": ModelSpec(
        vocab_size=1024, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    ),
    # ≈10M parameters: still seconds to build, minutes of CPU training.
    "small": ModelSpec(
        vocab_size=4096, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1024
    ),
}


def default_corpus(n_tasks: int = 300) -> list[str]:
    """The tokenizer's training text: the simulated device's vocabulary, screens, candidate actions and
    instructions over ``n_tasks`` training tasks, plus the prompt's own frame, so the BPE merges cover what the
    policy reads and writes. Deterministic."""
    from distrl_stream.envs.sim import sim_corpus, sim_tasks

    texts = list(sim_corpus(n_tasks))
    tasks = sim_tasks("train", n_tasks)
    texts += [t.instruction for t in tasks]
    # Whole prompts teach the merges across the prompt's field labels and line breaks.
    texts += [build_prompt(t.instruction, "Home", ['{"action_type":"navigate_home"}']) for t in tasks]
    return texts


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (GPT-2/Qwen style: every byte is a token, so any text is encodable).

    Args:
        corpus: training texts.
        vocab_size: target size including the byte alphabet and the end-of-text token; a small corpus may stop
            short of it (the tokenizer then has fewer merges, never an unknown token).

    Returns:
        A fast tokenizer whose eos and pad token is ``<|endoftext|>`` and which adds no BOS.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def build_model(
    out_dir: Path,
    size: ModelSize | ModelSpec = "tiny",
    *,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Build a randomly initialised Qwen2 policy and its tokenizer into ``out_dir`` (atomically).

    Args:
        out_dir: target folder; it must not exist unless ``overwrite``.
        size: ``tiny`` (≈0.33M parameters), ``small`` (≈10M), ``tiny-vl`` (a vision-language model,
            :mod:`distrl_stream.policy.vision`), or a :class:`ModelSpec` of any other shape.
        corpus: tokenizer training texts; default :func:`default_corpus`.
        seed: seeds the weight initialisation.
        overwrite: replace an existing folder.

    Returns:
        ``out_dir``.

    Raises:
        ModelBuildError: unknown size, or the folder exists and ``overwrite`` is false.
    """
    known = sorted([*SPECS, *VISION_SPECS])
    if isinstance(size, str) and size not in known:
        raise ModelBuildError(f"unknown model size {size!r}; choose one of {known}")
    if out_dir.exists() and not overwrite:
        raise ModelBuildError(f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    if isinstance(size, str) and size in VISION_SPECS:
        build_vision_model(out_dir, VISION_SPECS[size], corpus=corpus, seed=seed)
        return out_dir
    spec = SPECS[size] if isinstance(size, str) else size
    tokenizer = train_tokenizer(default_corpus() if corpus is None else corpus, spec.vocab_size)
    tokenizer.model_max_length = spec.max_positions
    eos_id = tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    model = initialised(lambda: Qwen2ForCausalLM(config), spec.hidden_size, eos_id, seed)
    write_model_dir(out_dir, model, tokenizer)
    return out_dir


def initialised(make: Callable[[], PreTrainedModel], hidden_size: int, eos_id: int, seed: int) -> PreTrainedModel:
    """A local model made by ``make()`` under ``seed``, with unit-norm embedding rows and ``eos_id`` as every special
    token of its generation config.

    The RNG is forked, so building a model never changes the caller's random stream. Unit-norm rows: LoRA never
    trains the (tied) embedding, and its scale bounds every logit (|logit| <= |h|·|e|, with |h| ≈ sqrt(hidden) after
    the final norm). At the default std 0.02 a LoRA-trained tiny policy could not put more than ~0.9 on one of three
    tokens; unit-norm rows lift that bound while the untrained policy keeps a high entropy (logits ~ N(0, 1)).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
        torch.nn.init.normal_(model.get_input_embeddings().weight, std=hidden_size**-0.5)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    return model


def write_model_dir(out_dir: Path, *parts: PreTrainedModel | PreTrainedTokenizerFast | ProcessorMixin) -> None:
    """Save each part (model, tokenizer or processor) into ``out_dir`` atomically, replacing what was there."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    with atomic_dir(out_dir) as tmp:
        for part in parts:
            part.save_pretrained(tmp)


def count_parameters(model_dir: Path) -> int:
    """Number of parameters of the model saved in ``model_dir`` (tied embeddings counted once)."""
    model = load_base_model(model_dir)
    return sum(p.numel() for p in model.parameters())


def load_base_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The model saved in ``model_dir`` with its transformers auto class: image-text-to-text for a vision-language
    model (:func:`~distrl_stream.policy.vision.is_vision_model`), causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_model(model_dir) else AutoModelForCausalLM
    return auto.from_pretrained(model_dir, dtype=dtype)
