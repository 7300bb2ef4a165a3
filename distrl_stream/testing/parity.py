"""Behaviour/learner log-probability parity: how far the learner's log π(a|s) is from what the server reported."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from distrl_stream.inference.client import ActionResult
from distrl_stream.policy.logprobs import ChoiceConstraint, action_logprobs
from distrl_stream.policy.precision import Precision, autocast


def logprob_gaps(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    results: Sequence[ActionResult],
    candidates: Sequence[Sequence[str] | None] | None = None,
    *,
    batch_size: int = 32,
    precision: Precision = "float32",
) -> list[float]:
    """|server log μ(a|s) − learner log π(a|s)| per answer, in nats: ``model`` recomputes each result's action
    tokens on its prompt (under its candidates in choice mode; None: free mode), ``batch_size`` prompts at a time, in
    the learner's ``precision``."""
    constraint = ChoiceConstraint(tokenizer, model.config.vocab_size) if candidates is not None else None
    gaps: list[float] = []
    with torch.no_grad(), autocast(next(model.parameters()).device, precision):
        for start in range(0, len(prompts), batch_size):
            chunk = slice(start, start + batch_size)
            out = action_logprobs(
                model,
                tokenizer,
                prompts[chunk],
                [r.token_ids for r in results[chunk]],
                candidates[chunk] if candidates is not None else None,
                constraint=constraint,
            )
            served = torch.tensor([r.logprob for r in results[chunk]])
            gaps += (out.logprob - served).abs().tolist()
    return gaps
