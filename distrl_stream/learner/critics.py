"""Critics: the step value V(s) and DigiRL's trajectory value V_traj, as small heads on frozen-model features.

Choice: a critic is an MLP on a feature vector, and the feature of a prompt is the frozen base model's final hidden
state at the prompt's last token, computed under ``no_grad`` with the LoRA adapter switched off. The base never
changes, so a prompt's feature is stable while the policy learns (the critic does not chase a moving
representation), it costs one forward pass that the policy's own log-prob pass already resembles, and the heads
train in microseconds on a CPU. Both heads output a logit; the value is σ(logit), a success probability in [0, 1],
matching the sparse 0/1 success reward of the tasks.

The heads take feature tensors, not text, so they are independent of how features are made; :func:`prompt_features`
is the one function that makes them from a transformers model + tokenizer + prompts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distrl_stream.policy.logprobs import (
    Encoder,
    encode_prompts,
    pack_rows,
    packed_decoder_states,
    padded_decoder_states,
    shared_prefix_groups,
    text_config,
)
from distrl_stream.policy.prompt import ModelPrompt, prompt_image


class ValueHead(nn.Module):
    """MLP from a feature vector to a value logit: Linear → GELU → Linear.

    No input normalisation: the base model's final hidden states already come out of its final norm, and a LayerNorm
    here would erase the features' mean direction, which can carry the signal.
    """

    def __init__(self, feature_dim: int, hidden_dim: int = 256) -> None:
        """Build the head.

        Args:
            feature_dim: size of the feature vector (the base model's hidden size).
            hidden_dim: width of the hidden layer.
        """
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(feature_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, 1),
        )

    def forward(self, features: Tensor) -> Tensor:
        """Value logits: ``[N, D] -> [N]``."""
        return self.net(features).squeeze(-1)

    def value(self, features: Tensor) -> Tensor:
        """Success probability σ(logit): ``[N, D] -> [N]`` in [0, 1]."""
        return torch.sigmoid(self.forward(features))


class StepCritic(ValueHead):
    """V(s_t): the success probability from the state of step t; trained on Retrace targets (``aride.critic_loss``).

    Its features are those of the step's prompt (instruction + screen + recent actions), the same text the policy
    acts on.
    """


class TrajectoryCritic(ValueHead):
    """V_traj(instruction): DigiRL's instruction-level value, the probability the policy solves this task.

    Its features are those of the episode's first prompt (the instruction on the starting screen). Used by the
    DigiRL-style baseline to filter trajectories (and available to a curriculum).
    """

    def loss(self, features: Tensor, success: Tensor) -> Tensor:
        """Binary cross-entropy against episode success.

        Args:
            features: ``[B, D]`` features of each episode's first prompt.
            success: ``[B]`` bool or 0/1 episode success.

        Returns:
            Scalar loss.
        """
        logits = self.forward(features)
        return F.binary_cross_entropy_with_logits(logits, success.to(logits.dtype))


@torch.no_grad()
def prompt_features(
    model: Any,
    tokenizer: Encoder,
    prompts: Sequence[ModelPrompt],
    *,
    batch_size: int = 32,
    max_length: int = 512,
    shared_prefix_tokens: int = 0,
) -> Tensor:
    """Final hidden state of each prompt's last token under the frozen base model.

    Works for a plain transformers causal LM and for a peft model (its adapter is disabled for the pass, so the
    features come from the base weights). Prompts are tokenised exactly as the tokenizer does by default, one by one,
    left-truncated to ``max_length`` (the last token is the one that matters) and left-padded per batch, so a
    prompt's feature does not depend on what it is batched with. A vision policy's image prompts run with their
    image, so the feature of a step includes what its screenshot shows; they are never truncated.

    Args:
        model: transformers causal LM (its decoder is run, not its output head), a vision-language model, or a peft
            wrapper of one.
        tokenizer: its tokenizer (a vision policy's processor).
        prompts: the prompts (text, :class:`~distrl_stream.policy.prompt.ImagePrompt`, or the server's ids of
            either: :class:`~distrl_stream.policy.prompt.TokenPrompt`).
        batch_size: prompts per forward pass.
        max_length: most tokens kept per prompt.
        shared_prefix_tokens: pack the prompts of a pass that share at least this many leading tokens, each shared
            prefix computed once (:func:`~distrl_stream.policy.logprobs.action_logprobs`' packing: the same
            features); 0 never packs. Image prompts are never packed.

    Returns:
        ``[len(prompts), hidden_size]`` float32 tensor on the CPU, without gradient.
    """
    device = next(model.parameters()).device
    was_training = model.training
    adapter_off = model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    rows: list[Tensor] = []
    model.eval()
    try:
        with adapter_off, torch.no_grad():
            for start in range(0, len(prompts), batch_size):
                batch = prompts[start : start + batch_size]
                inputs = encode_prompts(tokenizer, batch)
                # An image prompt is kept whole: cutting it could cut image tokens off their pixels.
                encoded = [
                    ids if prompt_image(p) is not None else ids[-max_length:]
                    for p, ids in zip(batch, inputs.input_ids, strict=True)
                ]
                if not all(encoded):
                    raise ValueError(f"a prompt in {list(prompts[start : start + batch_size])!r} has no tokens")
                groups = shared_prefix_groups(encoded, shared_prefix_tokens) if shared_prefix_tokens else []
                if any(prefix for prefix, _ in groups) and not inputs.images:
                    # An empty action's index is its row's last prompt token.
                    packed = pack_rows(encoded, [()] * len(encoded), groups, 1)
                    last_states = packed_decoder_states(model, packed)[packed.action_index[:, 0].to(device)]
                else:
                    states, width_p = padded_decoder_states(
                        model, encoded, [()] * len(encoded), inputs.images_to(device)
                    )
                    last_states = states[:, width_p - 1]
                rows.append(last_states.float().cpu())
    finally:
        model.train(was_training)
    if not rows:
        return torch.zeros(0, text_config(model).hidden_size)
    return torch.cat(rows)
