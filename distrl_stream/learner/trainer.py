"""The learner's update: one A-RIDE step (docs/design.md §5), or a baseline's, on whole episodes from the replay buffer.

Read :meth:`Trainer.aride_update` against docs/design.md §5: it is docs/learner.md's update line for line. The pieces:

- the policy is the base model + a peft LoRA adapter whose shape (rank, α, target modules) is ``[model]``'s, the
  shape the inference server accepts (:func:`load_policy`);
- log π(a_t|s_t) and the per-token entropy come from :func:`distrl_stream.policy.logprobs.action_logprobs` on the
  very prompt the collector sent (:meth:`Trainer.step_prompt`, the base model's :class:`Prompter`), under the same
  choice constraint as the server in choice mode, one micro-batch of steps per forward pass (the steps' shared
  prompt prefix computed once, `learner.shared_prefix`);
- V(s_t) is the step critic on the frozen base model's prompt features, cached per prompt (:class:`FeatureCache`:
  the base never changes, so neither do the features);
- the DPER priorities of the sampled episodes are refreshed after every update, and the next
  1/``priority_refresh_interval`` of the buffer too (round robin: all of them every ``priority_refresh_interval``).

The baselines run in the same class: ``digirl`` (trajectory-critic filter + binarised doubly-robust step advantage),
``filtered_bc`` (imitate successful episodes) and ``bc`` (imitate every episode: the offline warm start).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import Tensor
from transformers import AutoTokenizer

from distrl_stream.config import ALGORITHMS, Algorithm, LearnerConfig, ModelConfig
from distrl_stream.errors import ActionConstraintError, LearnerError, ScreenshotError, TrajectoryError
from distrl_stream.events.screenshots import read_screenshot
from distrl_stream.learner import aride
from distrl_stream.learner.buffer import ReplayBuffer, is_beta, trajectory_priorities
from distrl_stream.learner.critics import StepCritic, TrajectoryCritic, prompt_features
from distrl_stream.learner.records import (
    EpisodeBatch,
    EpisodeRecord,
    check_choices,
    check_screenshots,
    collate,
    step_screenshot,
)
from distrl_stream.policy.logprobs import (
    MIN_SHARED_PREFIX_TOKENS,
    ChoiceConstraint,
    Encoder,
    action_logprobs,
    check_image_tokens,
    check_output_head,
    encode_prompts,
    text_config,
    text_tokenizer,
    use_shared_prefix_attention,
)
from distrl_stream.policy.model import load_base_model
from distrl_stream.policy.precision import Precision, autocast, torch_dtype
from distrl_stream.policy.prompt import ImagePrompt, ModelPrompt, Prompt, Prompter, TokenPrompt
from distrl_stream.policy.vision import load_processor

log = logging.getLogger(__name__)

# Averages the gradients of the given parameters over a learner group in place; the flag says whether this member
# computed any (False: it takes part with zero weight). Returns whether any member did (learner/group.py).
GradSync = Callable[[Sequence[torch.nn.Parameter], bool], bool]

# ----------------------------------------------------------------------------------------------------------------
# Policy model
# ----------------------------------------------------------------------------------------------------------------


def lora_config(model: ModelConfig, base: torch.nn.Module) -> LoraConfig:
    """The LoRA shape of ``[model]`` on ``base``: what the learner trains and the server (``--max-lora-rank``)
    accepts. ``["all-linear"]`` is resolved here, from the architecture, to the names of its linear layers."""
    return LoraConfig(
        r=model.lora_rank,
        lora_alpha=model.lora_alpha,
        lora_dropout=model.lora_dropout,
        target_modules=lora_target_modules(model, base),
        task_type="CAUSAL_LM",
    )


def lora_target_modules(model: ModelConfig, base: torch.nn.Module) -> list[str] | str:
    """``model.lora_target_modules``, with ``all-linear`` as the short names of every linear layer of ``base`` but
    its output head (q/k/v/o and gate/up/down projections in Qwen2 and Llama): names, not module paths, so the
    adapter's config reads as vLLM expects whatever the depth.

    A vision-language model's targets (``all-linear`` or named) are in its language tower only, as a peft regex over
    module paths: the vision tower shares names with it (q_proj, ...), and vLLM serves LoRA on the language model.
    """
    head = base.get_output_embeddings()
    decoder = base.get_decoder()
    tower = next((name for name, m in base.named_modules() if m is decoder), "")
    names = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in (decoder if tower else base).named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        }
        if model.lora_target_modules == ["all-linear"]
        else model.lora_target_modules
    )
    if not tower or getattr(base.config, "vision_config", None) is None:
        return names
    return rf"{re.escape(tower)}\..*\.({'|'.join(map(re.escape, names))})"


def load_policy(
    model_dir: Path,
    model: ModelConfig,
    adapter: Path | None = None,
    device: torch.device | None = None,
    precision: Precision = "float32",
    *,
    vision: bool = False,
) -> tuple[PeftModel, Encoder]:
    """The trainable policy: the base model plus a LoRA adapter (fresh, or loaded from ``adapter``), on ``device``,
    and what encodes its prompts: the tokenizer, or a vision-language model's processor.

    The adapter's weights are float32 (peft's), the master weights the optimiser steps. The frozen base is float32
    on the CPU, where bf16 runs as autocast (:func:`~distrl_stream.policy.precision.autocast`: measured faster than
    bf16 weights, docs/learner.md "Precision"), and in ``precision`` on CUDA, where it halves the memory.

    Args:
        model_dir: the base model folder (the one the server serves).
        model: LoRA shape and policy id.
        adapter: a peft adapter folder to start from (warm start or checkpoint); None for a fresh adapter, which
            leaves the base model's behaviour unchanged (peft initialises B = 0).
        device: where the model lives (default the CPU).
        precision: the learner's (``learner.dtype`` resolved by
            :func:`~distrl_stream.policy.precision.resolve_precision`).
        vision: the policy reads screenshots (:func:`~distrl_stream.policy.model_dir.reads_screenshots`): its
            prompts are encoded by the model's processor; else by its tokenizer (a vision-language model then
            reads text only, as its collectors prompt it).

    Raises:
        LearnerError: the adapter folder is not a peft LoRA adapter, or its rank exceeds ``model.lora_rank`` (the
            server would refuse to load its versions).
    """
    device = device or torch.device("cpu")
    tokenizer = load_processor(model_dir) if vision else AutoTokenizer.from_pretrained(model_dir)
    dtype = torch_dtype(precision) if device.type == "cuda" else torch.float32
    base = load_base_model(model_dir, dtype).to(device)
    if adapter is None:
        return get_peft_model(base, lora_config(model, base)), tokenizer
    config_file = adapter / "adapter_config.json"
    try:
        adapter_cfg = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise LearnerError(f"{adapter} is not a peft adapter folder ({config_file}: {exc})") from None
    rank = int(adapter_cfg.get("r", 0))
    if adapter_cfg.get("peft_type") != "LORA" or not 0 < rank <= model.lora_rank:
        raise LearnerError(
            f"adapter {adapter}: peft_type {adapter_cfg.get('peft_type')!r} rank {rank}; the learner needs a LoRA "
            f"adapter of rank <= model.lora_rank ({model.lora_rank}), which the server accepts"
        )
    policy = PeftModel.from_pretrained(base, adapter, is_trainable=True).to(device)
    # Its versions name the base they are trained on, not the folder the adapter was first made on (a warm start
    # from another run or machine names a path that may not exist here).
    policy.peft_config["default"].base_model_name_or_path = str(model_dir)
    return policy, tokenizer


class FeatureCache:
    """Frozen-base prompt features for the critics, computed once per prompt (LRU, ``size`` prompts).

    The features come from the base model with the adapter off, which never changes while the policy learns, so a
    cached feature is never stale. With ``shared_prefix_tokens`` the prompts computed together are packed around the
    prefixes they share (:func:`~distrl_stream.learner.critics.prompt_features`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Encoder,
        size: int,
        precision: Precision = "float32",
        *,
        shared_prefix_tokens: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.size = size
        self.precision = precision
        self.shared_prefix_tokens = shared_prefix_tokens
        # Keyed by text or token ids, and image digest: a key never holds the screenshot itself.
        self._cache: OrderedDict[_CacheKey, Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __call__(self, prompts: Sequence[ModelPrompt]) -> Tensor:
        """``[len(prompts), hidden]`` features, no gradient."""
        keys = [_cache_key(p) for p in prompts]
        missing = {k: p for k, p in zip(keys, prompts, strict=True) if k not in self._cache}
        computed: Sequence[Tensor] = []
        if missing:
            with autocast(next(self.model.parameters()).device, self.precision):
                computed = prompt_features(
                    self.model, self.tokenizer, list(missing.values()), shared_prefix_tokens=self.shared_prefix_tokens
                ).float()
        fresh = dict(zip(missing, computed, strict=True))
        self.misses += len(missing)
        self.hits += len(prompts) - len(missing)
        rows = []
        for k in keys:
            row = fresh.get(k)
            if row is None:
                row = self._cache[k]
                self._cache.move_to_end(k)
            rows.append(row)
        for k, row in fresh.items():
            self._cache[k] = row
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return torch.stack(rows) if rows else torch.zeros(0, text_config(self.model).hidden_size)


_CacheKey = str | tuple[str, str] | tuple[bytes, str]


def _cache_key(prompt: ModelPrompt) -> _CacheKey:
    if isinstance(prompt, TokenPrompt):
        # A digest of the ids, not the ids: 16 bytes a key instead of a tuple of a few hundred ints.
        digest = hashlib.blake2b(np.asarray(prompt.ids, dtype=np.int64).tobytes(), digest_size=16).digest()
        return (digest, prompt.image.image_sha256 if prompt.image is not None else "")
    return (prompt.text, prompt.image_sha256) if isinstance(prompt, ImagePrompt) else prompt


@functools.lru_cache(maxsize=512)
def _verified_screenshot(uri: str, sha256: str) -> bytes:
    """A screenshot read back and checked, kept for its next update (a batch's, a few hundred screens): the bytes of
    a digest never change, and an image lost later is met at the next ingest, which reads every one again."""
    return read_screenshot(uri, sha256)


# ----------------------------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------------------------


class Trainer:
    """Policy, critics and optimisers of one learner, and the update of each algorithm on batches of its buffer.

    Args:
        cfg: the learner's hyper-parameters.
        model: the policy (:func:`load_policy`).
        tokenizer: its tokenizer, or a vision policy's processor (:func:`load_policy`).
        buffer: the replay buffer updates sample from (the learner's; it owns and checkpoints it). Updates refresh
            its priorities and remove episodes whose actions are impossible.
        temperature: the sampling temperature the server uses (log π is recomputed with it).
        grad_sync: in a learner group, the gradient average over members (every update calls it exactly once on
            every member, whatever its buffer holds); None for a single learner.
        precision: the forward passes' (``learner.dtype`` resolved): ``bfloat16`` runs them under autocast; the
            adapter, the critics, the optimisers and every loss stay float32.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        model: PeftModel,
        tokenizer: Encoder,
        buffer: ReplayBuffer,
        *,
        temperature: float = 1.0,
        grad_sync: GradSync | None = None,
        precision: Precision = "float32",
    ) -> None:
        self.cfg = cfg
        self.grad_sync = grad_sync
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.precision = precision
        torch.manual_seed(cfg.seed)
        hidden = text_config(model).hidden_size
        self.step_critic = StepCritic(hidden, cfg.critic_hidden)
        self.traj_critic = TrajectoryCritic(hidden, cfg.critic_hidden)
        self.policy_params = [p for p in model.parameters() if p.requires_grad]
        if not self.policy_params:
            raise LearnerError("the policy has no trainable parameters (was the adapter loaded for inference only?)")
        self.critic_params = [*self.step_critic.parameters(), *self.traj_critic.parameters()]
        optimiser = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
        self.policy_opt = optimiser(self.policy_params, lr=cfg.policy_lr)
        self.critic_opt = optimiser(self.critic_params, lr=cfg.critic_lr)
        self.buffer = buffer
        # A processor (not a tokenizer) is what a vision-language model encodes its prompts with.
        self.prompter = Prompter(tokenizer, vision=tokenizer is not text_tokenizer(tokenizer))
        # Micro-batched forward passes whose backward is still to be done (policy_terms -> _step).
        self._deferred: list[tuple[Sequence[tuple[EpisodeRecord, int]], Tensor, Tensor]] = []
        check_output_head(model)
        if cfg.gradient_checkpointing:
            dropout = [
                f"{name} {value}"
                for name, value in (
                    ("model.lora_dropout", getattr(model.peft_config.get("default"), "lora_dropout", 0.0)),
                    ("the base's attention_dropout", getattr(model.config, "attention_dropout", 0.0)),
                )
                if value
            ]
            if dropout:
                # Checkpointing needs training mode, which turns dropout on: log π would no longer be the server's.
                raise LearnerError(
                    f"learner.gradient_checkpointing needs a policy without dropout: {', '.join(dropout)}"
                )
            # Non-reentrant: the frozen embedding's output needs no gradient for the layers' recomputation to work.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()  # transformers checkpoints only in training mode; the policy has no dropout (lora_dropout)
        # Packed passes compute the prompt prefix an episode's steps share once (docs/learner.md).
        unpackable = use_shared_prefix_attention(model) if cfg.shared_prefix else None
        if unpackable:
            log.info("learner.shared_prefix is off, every step's prompt is computed whole: %s", unpackable)
        self.shared_prefix_tokens = MIN_SHARED_PREFIX_TOKENS if cfg.shared_prefix and unpackable is None else 0
        self.features = FeatureCache(
            model, tokenizer, cfg.feature_cache_size, precision, shared_prefix_tokens=self.shared_prefix_tokens
        )
        self.vocab_size = int(text_config(model).vocab_size)
        self.constraint = ChoiceConstraint(text_tokenizer(tokenizer), self.vocab_size)
        self.updates = 0
        self.rejected = 0  # episodes removed because their tokens are impossible under their candidates
        self._refresh_credit = 0.0  # episodes owed to the round-robin priority refresh (a fraction carries over)
        # Steps ingested with the server's prompt ids, and those whose ids this learner's own rendering would not
        # have produced (another template, tokenizer or prompt version: docs/design.md §6.2).
        self.prompt_ids_checked = 0
        self.prompt_ids_mismatched = 0
        # Policy steps taken, and (version, policy steps) when the weights were those of the served version: |log π −
        # log μ| on that version's steps is the inference/training mismatch, plus the drift of the steps since.
        self._policy_steps = 0
        self._weights_of: tuple[int, int] | None = None

    # -- buffer --------------------------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the buffer holds enough episodes for an update."""
        return len(self.buffer) >= self.cfg.min_buffer_episodes

    # -- the update ----------------------------------------------------------------------------------------------

    def update(
        self, algorithm: Algorithm | None = None, *, version: int, contribute: bool = True
    ) -> dict[str, float] | None:
        """One update of ``algorithm`` (default ``cfg.algorithm``) on a batch from the buffer.

        Args:
            algorithm: the update rule.
            version: the learner's current policy version (the learner owns it); the batch's lag statistics are
                measured from it.
            contribute: False: in a group, take part in the others' update with zero weight (too little data).

        Returns:
            The update's statistics, or None when there was nothing to learn from (empty buffer; no successful
            episode yet for filtered BC; a batch with an episode whose tokens are impossible under its candidates,
            which is removed from the buffer and counted in ``rejected``).
        """
        algorithm = algorithm or self.cfg.algorithm
        self._deferred.clear()  # left by an update that raised between its forward and its backward
        stats = self._local_update(algorithm, version) if contribute and len(self.buffer) else None
        if stats is None:
            # In a group the others' step happens anyway: take part with zero weight, apply the same step.
            stats = self._step_without_batch(algorithm)
            if stats is None:
                return None
        self.updates += 1
        if algorithm == "aride":
            # 1/K of the buffer after every update, round robin: every episode once per K updates, as the authors'
            # full refresh every K does, without a pause of minutes (on a pretrained model) that outlasts a stop.
            # The share carries its fraction over: a large K (10**9) refreshes practically never, as it did.
            self._refresh_credit += len(self.buffer) / self.cfg.priority_refresh_interval
            share = int(self._refresh_credit + 1e-9)  # 4.8 five times is 24, not 23.999…
            self._refresh_credit -= share
            stats["priorities_refreshed"] = float(self.refresh_priorities(share))
        return stats

    def _local_update(self, algorithm: Algorithm, version: int) -> dict[str, float] | None:
        try:
            if algorithm == "aride":
                return self.aride_update(version)
            if algorithm == "digirl":
                return self.digirl_update(version)
            if algorithm in ("filtered_bc", "bc"):
                return self.bc_update(version, filtered=algorithm == "filtered_bc")
            raise LearnerError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
        except (ActionConstraintError, ScreenshotError) as exc:
            log.warning("batch has an unusable step (%s); removing the episodes that hold one", exc)
            self.policy_opt.zero_grad(set_to_none=True)
            self.critic_opt.zero_grad(set_to_none=True)
            self._reject_impossible()
            return None

    def _step_without_batch(self, algorithm: Algorithm) -> dict[str, float] | None:
        """A group member with nothing to learn from: its zero-weight share of the group's step (None when alone,
        or when no member had a batch)."""
        if self.grad_sync is None:
            return None
        self.policy_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        if not self.grad_sync([*self.policy_params, *self.critic_params], False):
            return None
        warming_up = algorithm == "aride" and self.updates < self.cfg.critic_warmup_updates
        return {**self._apply(policy=not warming_up), "contributed": 0.0}

    def aride_update(self, version: int) -> dict[str, float]:
        """One A-RIDE update (docs/design.md §5) on a DPER sample; refreshes the sampled episodes' priorities."""
        cfg = self.cfg
        beta = is_beta(self.updates, cfg.is_beta_start, cfg.is_beta_end, cfg.is_beta_anneal_updates)
        sample = self.buffer.sample(cfg.batch_episodes, beta=beta)
        batch = collate(sample.episodes)
        logp, entropy = self.policy_terms(sample.episodes, batch.mask)  # [B, T], with gradient
        mismatch = self._mismatch_stats(version, logp, batch)  # before this update's step
        value_logits, values, bootstrap = self.critic_values(sample.episodes, batch.mask)
        rhos = aride.importance_ratios(logp, batch.behaviour_logp, batch.mask)
        v_ret = aride.retrace_targets(
            batch.rewards, values, bootstrap, batch.done, rhos, batch.mask, cfg.gamma, cfg.retrace_lambda, cfg.c_bar
        )
        adv = aride.advantages(batch.rewards, values, v_ret, bootstrap, batch.done, batch.mask, cfg.gamma)
        policy_adv = adv - aride.masked_mean(adv, batch.mask) if cfg.advantage_centering else adv
        pl = aride.policy_loss(
            logp,
            rhos,
            policy_adv * batch.mask,
            entropy,
            batch.invalid,
            batch.mask,
            cfg.rho_bar,
            cfg.entropy_coef,
            cfg.invalid_penalty,
            episode_weights=sample.is_weights,
        )
        vl = aride.critic_loss(value_logits, v_ret, batch.mask, sample.is_weights, kind=cfg.critic_loss)
        warming_up = self.updates < cfg.critic_warmup_updates
        # While the critic warms up its advantages are noise: only the critic learns.
        loss = vl if warming_up else pl.loss + vl
        if cfg.trajectory_critic:
            loss = loss + self._trajectory_critic_loss(sample.episodes)
        grads = self._step(loss, policy=not warming_up)
        deltas = aride.td_errors(batch.rewards, values, bootstrap, batch.done, batch.mask, cfg.gamma)
        priorities = trajectory_priorities(deltas, rhos, logp, batch.mask, cfg.dper_w1, cfg.dper_w2, cfg.dper_w3)
        self.buffer.update_priorities(sample.keys, priorities)
        return {
            "loss_policy": pl.loss.item(),
            "loss_pg": pl.pg.item(),
            "loss_critic": vl.item(),
            "entropy": pl.entropy.item(),
            "invalid_logp": pl.invalid.item(),
            **aride.rho_stats(rhos, batch.mask, cfg.rho_bar),
            **_prefixed("advantage", aride.masked_stats(adv, batch.mask)),
            "value_error": float(aride.masked_mean((values - v_ret).abs(), batch.mask)),
            "value_mean": float(aride.masked_mean(values, batch.mask)),
            "is_weight_mean": float(sample.is_weights.mean()),
            "sampled_priority_mean": float(priorities.mean()),
            **_batch_stats(version, batch.policy_version, batch.mask, batch.success),
            **mismatch,
            **grads,
        }

    def mark_version(self, version: int) -> None:
        """The policy's weights are now exactly those of the served ``version`` (just published or announced; or a
        fresh adapter, the base model's version 0)."""
        self._weights_of = (version, self._policy_steps)

    def _mismatch_stats(self, version: int, logp: Tensor, batch: EpisodeBatch) -> dict[str, float]:
        """|log π − log μ| over the batch's steps acted by the learner's current version, and how many policy steps
        the weights have taken since that version (0: the mismatch alone, no staleness in it); empty when the batch
        has no such step or the weights of the version are not known (after a restart, until the next version)."""
        if self._weights_of is None or self._weights_of[0] != version:
            return {}
        stats = aride.mismatch_stats(logp, batch.behaviour_logp, batch.policy_version == version, batch.mask)
        if stats:
            stats["logp_mismatch_updates_ahead"] = float(self._policy_steps - self._weights_of[1])
        return stats

    def critic_values(self, episodes: Sequence[EpisodeRecord], mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The step critic on a batch: logits ``[B, T]`` (with gradient, for its loss), values σ(logits) (detached,
        for targets and advantages), and V after each episode's last step ``[B]``."""
        value_logits = aride.pad_steps(self.step_critic(self.step_features(episodes)), mask)
        return value_logits, torch.sigmoid(value_logits).detach(), self.bootstrap_values(episodes)

    def digirl_update(self, version: int) -> dict[str, float] | None:
        """DigiRL-style update: keep the top quantile of the buffer by 1{success} − V_traj, draw uniformly among
        them, and raise log π where the binarised doubly-robust step advantage is positive. Both critics learn."""
        cfg = self.cfg
        keys = self.buffer.keys()
        episodes = [self.buffer.get(k) for k in keys]
        first = self.features([self.step_prompt(e, 0) for e in episodes])
        success = torch.tensor([e.success for e in episodes], dtype=torch.bool)
        with torch.no_grad():
            traj_adv = aride.trajectory_advantages(success, self.traj_critic.value(first))
        keep = aride.top_quantile_mask(traj_adv, cfg.digirl_quantile)
        kept = [k for k, m in zip(keys, keep.tolist(), strict=True) if m]
        sample = self.buffer.sample_uniform(cfg.batch_episodes, among=kept)
        batch = collate(sample.episodes)
        logp, _entropy = self.policy_terms(sample.episodes, batch.mask)
        mismatch = self._mismatch_stats(version, logp, batch)
        value_logits, values, bootstrap = self.critic_values(sample.episodes, batch.mask)
        step_adv = aride.digirl_step_advantages(
            batch.rewards, values, bootstrap, batch.done, batch.mask, cfg.gamma, cfg.digirl_lambda
        )
        pg = aride.digirl_policy_loss(logp, step_adv, batch.mask, torch.ones(len(sample.keys), dtype=torch.bool))
        rhos = aride.importance_ratios(logp, batch.behaviour_logp, batch.mask)
        v_ret = aride.retrace_targets(
            batch.rewards, values, bootstrap, batch.done, rhos, batch.mask, cfg.gamma, cfg.retrace_lambda, cfg.c_bar
        )
        vl = aride.critic_loss(value_logits, v_ret, batch.mask, kind=cfg.critic_loss)
        # V_traj learns from the whole buffer (a uniform draw), not only from what its own filter kept.
        pick = torch.as_tensor(self.buffer.rng.integers(0, len(keys), size=cfg.batch_episodes))
        tl = self.traj_critic.loss(first[pick], success[pick])
        grads = self._step(pg + vl + tl)
        return {
            "loss_policy": pg.item(),
            "loss_critic": vl.item(),
            "loss_traj_critic": tl.item(),
            "kept_fraction": float(keep.float().mean()),
            "positive_advantage_frac": float(aride.masked_mean(step_adv, batch.mask)),
            **aride.rho_stats(rhos, batch.mask, cfg.rho_bar),
            "value_error": float(aride.masked_mean((values - v_ret).abs(), batch.mask)),
            **_batch_stats(version, batch.policy_version, batch.mask, batch.success),
            **mismatch,
            **grads,
        }

    def bc_update(self, version: int, *, filtered: bool) -> dict[str, float] | None:
        """Behaviour cloning: −E[log π] over successful episodes (``filtered``) or over all (the warm start)."""
        cfg = self.cfg
        among = [k for k, e in self.buffer.items() if e.success] if filtered else None
        if among is not None and not among:
            return None
        sample = self.buffer.sample_uniform(cfg.batch_episodes, among=among)
        batch = collate(sample.episodes)
        logp, entropy = self.policy_terms(sample.episodes, batch.mask)
        mismatch = self._mismatch_stats(version, logp, batch)
        imitate = batch.success if filtered else torch.ones_like(batch.success)
        loss = aride.filtered_bc_loss(logp, batch.mask, imitate)
        grads = self._step(loss)
        return {
            "loss_policy": loss.item(),
            "entropy": float(aride.masked_mean(entropy.detach(), batch.mask)),
            "logp_mean": float(aride.masked_mean(logp.detach(), batch.mask)),
            "imitated_fraction": float(len(among) / len(self.buffer)) if among is not None else 1.0,
            **_batch_stats(version, batch.policy_version, batch.mask, batch.success),
            **mismatch,
            **grads,
        }

    # -- pieces of the update ------------------------------------------------------------------------------------

    @property
    def shared_prefix(self) -> bool:
        """Whether this trainer's passes pack steps around their shared prompt prefix."""
        return self.shared_prefix_tokens > 0

    def policy_terms(self, episodes: Sequence[EpisodeRecord], mask: Tensor) -> tuple[Tensor, Tensor]:
        """log π(a_t|s_t) (sum over the action's tokens) and the mean per-token entropy of π over the action's
        positions, for every step of ``episodes``, in the ``[B, T]`` layout (differentiable when grad is enabled).

        The steps go through the policy ``learner.micro_batch_steps`` at a time. With gradient and more steps than
        one micro-batch, the forward passes run without gradient and the result is a leaf: :meth:`_step` then
        backpropagates the loss to it, and redoes each micro-batch's forward with gradient, backpropagating that
        micro-batch's share (the loss couples an episode's steps through ρ and Retrace, so it needs every step's
        log π before any gradient exists). Peak memory is one micro-batch's activations; the cost is one forward
        pass more, and only for batches larger than a micro-batch. So a loss built on these terms must be
        backpropagated by :meth:`_step` (a plain ``backward()`` would stop at the leaves).

        Raises:
            ActionConstraintError: a choice-mode action whose tokens the candidates' grammar forbids.
        """
        steps = [(e, t) for e in episodes for t in range(len(e))]
        # Packed passes keep an episode's steps together (they share their prompt's start) and pad nothing; unpacked
        # micro-batches are of steps of similar length: each is padded to its longest, so sorted ones pad the least.
        order = list(range(len(steps)))
        if not self.shared_prefix:
            order.sort(key=lambda i: _step_tokens(*steps[i]))
        steps = [steps[i] for i in order]
        size = self.cfg.micro_batch_steps or max(len(steps), 1)
        if len(steps) <= size or not torch.is_grad_enabled():
            logprob, entropy = self._micro_batches(steps, size)
        else:
            with torch.no_grad():
                logprob, entropy = self._micro_batches(steps, size)
            logprob.requires_grad_(True)
            entropy.requires_grad_(True)
            self._deferred.append((steps, logprob, entropy))
        unsorted = torch.empty(len(order), dtype=torch.long)
        unsorted[order] = torch.arange(len(order))
        return aride.pad_steps(logprob[unsorted], mask), aride.pad_steps(entropy[unsorted], mask)

    def _micro_batches(self, steps: Sequence[tuple[EpisodeRecord, int]], size: int) -> tuple[Tensor, Tensor]:
        """Per-step log π and mean entropy of ``steps`` (flat, ``[N]`` each), ``size`` steps per forward pass."""
        parts = [self._step_terms(steps[i : i + size]) for i in range(0, len(steps), size)]
        if not parts:
            return torch.zeros(0), torch.zeros(0)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _step_terms(self, steps: Sequence[tuple[EpisodeRecord, int]]) -> tuple[Tensor, Tensor]:
        """One forward pass (in the learner's precision): per-step log π and mean per-token entropy of ``steps``, on
        the CPU, in float32."""
        with autocast(next(self.model.parameters()).device, self.precision):
            out = action_logprobs(
                self.model,
                self.tokenizer,
                [self.step_prompt(e, t) for e, t in steps],
                [e.steps[t].token_ids for e, t in steps],
                [e.steps[t].choices for e, t in steps],
                temperature=self.temperature,
                constraint=self.constraint,
                shared_prefix_tokens=self.shared_prefix_tokens,
            )
        per_step_entropy = out.entropy.sum(-1) / out.mask.sum(-1).clamp(min=1)
        # The A-RIDE maths and the critic heads run on the CPU beside the cached features; autograd carries the
        # gradient back to a policy on the GPU (no-ops on the CPU).
        return out.logprob.float().cpu(), per_step_entropy.float().cpu()

    def _backward_deferred(self) -> None:
        """The second half of a micro-batched :meth:`policy_terms`: each micro-batch's forward again, with gradient,
        backpropagated with the loss's gradient with respect to its steps' log π and entropy."""
        for steps, logprob, entropy in self._deferred:
            size = self.cfg.micro_batch_steps or len(steps)
            if logprob.grad is None and entropy.grad is None:
                continue  # the loss did not use the policy (the critic's warm-up)
            for i in range(0, len(steps), size):
                part = self._step_terms(steps[i : i + size])
                used = [
                    (out, leaf.grad)
                    for out, leaf in zip(part, (logprob, entropy), strict=True)
                    if leaf.grad is not None
                ]
                torch.autograd.backward([out for out, _ in used], [grad[i : i + size] for _, grad in used])
        self._deferred.clear()

    def step_prompt(self, episode: EpisodeRecord, t: int) -> ModelPrompt:
        """The prompt the policy saw at step ``t``: the server's token ids where the step carries them (a vision
        step's with its screenshot for the pixels), else the collector's prompt rebuilt in the base model's format
        (events written before ``Step.prompt_token_ids``, docs/design.md §6.2)."""
        ids = episode.steps[t].prompt_token_ids
        if ids is None:
            return self.rendered_prompt(episode, t)
        return TokenPrompt(ids, self.rendered_prompt(episode, t) if self.prompter.vision else None)  # type: ignore[arg-type]

    def rendered_prompt(self, episode: EpisodeRecord, t: int) -> Prompt:
        """Step ``t``'s prompt as this learner renders it (a vision policy's with the step's screenshot, read back
        through its claim check)."""
        step = episode.steps[t]
        screenshot = step_screenshot(episode, t, _verified_screenshot) if self.prompter.vision else None
        return self.prompter(
            episode.instruction, step.observation, episode.previous_actions(t), step.candidates, screenshot=screenshot
        )

    def _rendered_ids(self, episode: EpisodeRecord) -> list[tuple[int, list[int]]]:
        """(step, this learner's ids of its prompt) for each step that carries the server's ids."""
        steps = [t for t, step in enumerate(episode.steps) if step.prompt_token_ids is not None]
        if not steps:
            return []
        rendered = encode_prompts(self.tokenizer, [self.rendered_prompt(episode, t) for t in steps]).input_ids
        return list(zip(steps, rendered, strict=True))

    def check_image_tokens(self, episode: EpisodeRecord) -> None:
        """A vision policy's check at ingest: every step's server ids hold as many image tokens as its screenshot
        fills (else its pixels could not be placed, at every update that samples it). Text policies pass.

        Raises:
            TrajectoryError: a step whose ids do not, or whose prompt cannot be rendered at all (named).
        """
        if not self.prompter.vision:
            return
        try:
            for t, ids in self._rendered_ids(episode):
                try:
                    check_image_tokens(self.tokenizer, episode.steps[t].prompt_token_ids or (), ids)
                except LearnerError as exc:
                    raise TrajectoryError(f"episode {episode.episode_id!r} step {t}: {exc}") from None
        except (ScreenshotError, OSError, ValueError) as exc:  # e.g. a PNG whose digest matches but will not decode
            raise TrajectoryError(f"episode {episode.episode_id!r}: its prompts cannot be rendered: {exc}") from None

    def check_prompt_ids(self, episode: EpisodeRecord) -> int:
        """Compare each step's server ids with this learner's rendering of its prompt; count both in
        ``prompt_ids_checked`` / ``prompt_ids_mismatched`` and return the mismatches. The update trains on the
        server's ids either way: a mismatch is what re-rendering would have got wrong."""
        try:
            pairs = self._rendered_ids(episode)
        except (ScreenshotError, OSError, ValueError) as exc:  # a screenshot lost since ingest: nothing to compare
            log.warning("episode %s: prompt ids not checked: %s", episode.episode_id, exc)
            return 0
        mismatched = 0
        for t, ids in pairs:
            if tuple(ids) != episode.steps[t].prompt_token_ids:
                mismatched += 1
        if mismatched and not self.prompt_ids_mismatched:
            log.warning(
                "episode %s: %d of %d prompts tokenised by the server differ from this learner's rendering (another "
                "template, tokenizer or prompt version?); training on the server's ids",
                episode.episode_id,
                mismatched,
                len(pairs),
            )
        self.prompt_ids_checked += len(pairs)
        self.prompt_ids_mismatched += mismatched
        return mismatched

    def step_features(self, episodes: Sequence[EpisodeRecord]) -> Tensor:
        """Critic features of every step, flat and episode-major (``[N, hidden]``)."""
        return self.features([self.step_prompt(e, t) for e in episodes for t in range(len(e))])

    def bootstrap_values(self, episodes: Sequence[EpisodeRecord]) -> Tensor:
        """V(s_L) after each episode's last step: the critic's value of the final observation of a truncated
        episode that recorded one (TrajectoryEvent v2), else 0. A vision policy's critic needs the final screen's
        screenshot, which trajectories do not record: 0 (docs/design.md §6.1)."""
        out = torch.zeros(len(episodes))
        rows = [i for i, e in enumerate(episodes) if not e.terminal and e.final_observation is not None and len(e) > 0]
        if rows and not self.prompter.vision:
            # The final screen with the full history: previous_actions(L) includes the last action.
            prompts = [
                self.prompter(
                    episodes[i].instruction,
                    episodes[i].final_observation or "",
                    episodes[i].previous_actions(len(episodes[i])),
                    episodes[i].final_candidates,
                )
                for i in rows
            ]
            with torch.no_grad():
                out[rows] = self.step_critic.value(self.features(prompts))
        return out

    def _trajectory_critic_loss(self, episodes: Sequence[EpisodeRecord]) -> Tensor:
        first = self.features([self.step_prompt(e, 0) for e in episodes])
        return self.traj_critic.loss(first, torch.tensor([e.success for e in episodes]))

    def _step(self, loss: Tensor, *, policy: bool = True) -> dict[str, float]:
        """Backpropagate, average the gradients over the group (if any), then :meth:`_apply` them."""
        self.policy_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self._backward_deferred()
        if self.grad_sync is not None:
            self.grad_sync([*self.policy_params, *self.critic_params], True)
        return self._apply(policy=policy)

    def _apply(self, *, policy: bool) -> dict[str, float]:
        """Clip the policy's and the critics' gradients to max_grad_norm each, step both (the policy only when
        ``policy``)."""
        critic_norm = torch.nn.utils.clip_grad_norm_(self.critic_params, self.cfg.max_grad_norm)
        self.critic_opt.step()
        if not policy:
            return {"grad_norm_critic": float(critic_norm)}
        policy_norm = torch.nn.utils.clip_grad_norm_(self.policy_params, self.cfg.max_grad_norm)
        self.policy_opt.step()
        self._policy_steps += 1
        return {"grad_norm_policy": float(policy_norm), "grad_norm_critic": float(critic_norm)}

    # -- priorities ----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def episode_priorities(self, episodes: Sequence[EpisodeRecord]) -> Tensor:
        """DPER priorities p(τ) of ``episodes`` under the current policy and critic (no gradient)."""
        cfg = self.cfg
        batch = collate(episodes)
        logp, _ = self.policy_terms(episodes, batch.mask)
        values = aride.pad_steps(self.step_critic.value(self.step_features(episodes)), batch.mask)
        bootstrap = self.bootstrap_values(episodes)
        rhos = aride.importance_ratios(logp, batch.behaviour_logp, batch.mask)
        deltas = aride.td_errors(batch.rewards, values, bootstrap, batch.done, batch.mask, cfg.gamma)
        return trajectory_priorities(deltas, rhos, logp, batch.mask, cfg.dper_w1, cfg.dper_w2, cfg.dper_w3)

    def refresh_priorities(self, count: int) -> int:
        """Recompute the priorities of the next ``count`` held episodes, round robin; returns how many were
        updated.

        An episode whose tokens are impossible under its candidates, or (vision) whose screenshot can no longer be
        read back as recorded (ingest refuses both, but a buffer may hold one from before, and a store can lose a
        file) is removed and counted in ``rejected``, and the refresh is done again without it: it must not stop the
        learner, which would meet it again after every restart.
        """

        def score(_keys: list[int], episodes: list[EpisodeRecord]) -> Tensor:
            return self.episode_priorities(episodes)

        try:
            return self.buffer.refresh_next(score, count, batch_size=32)
        except (ActionConstraintError, ScreenshotError) as exc:
            log.warning("priority refresh met an unusable step (%s); removing the episodes that hold one", exc)
            self._reject_impossible()
            return self.buffer.refresh_next(score, count, batch_size=32)

    def _reject_impossible(self) -> None:
        """Remove every held episode whose tokens are impossible under its candidates or (vision) whose screenshots
        cannot be read back as recorded (checked one by one)."""
        bad = []
        for key, episode in self.buffer.items():
            try:
                check_choices(episode, self.constraint.allowed)
                if self.prompter.vision:
                    check_screenshots(episode)
            except (ActionConstraintError, ScreenshotError) as exc:
                bad.append(key)
                log.warning("removing %s: it cannot be used for an update", exc)
        self.buffer.remove(bad)
        self.rejected += len(bad)

    # -- persistence ---------------------------------------------------------------------------------------------

    def save_adapter(self, path: Path) -> None:
        """Write the LoRA adapter (peft format, what vLLM loads) into the folder ``path``."""
        self.model.save_pretrained(path)

    def state_dict(self) -> dict[str, Any]:
        """Critics, optimisers, counters and random state (the adapter and the buffer are saved separately)."""
        return {
            "step_critic": self.step_critic.state_dict(),
            "traj_critic": self.traj_critic.state_dict(),
            "policy_opt": self.policy_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "updates": self.updates,
            "rejected": self.rejected,
            "prompt_ids_checked": self.prompt_ids_checked,
            "prompt_ids_mismatched": self.prompt_ids_mismatched,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the policy must already hold the checkpoint's adapter)."""
        self.step_critic.load_state_dict(state["step_critic"])
        self.traj_critic.load_state_dict(state["traj_critic"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.updates = int(state["updates"])
        self.rejected = int(state["rejected"])
        # Checkpoints written before the prompt ids existed lack the counters.
        self.prompt_ids_checked = int(state.get("prompt_ids_checked", 0))
        self.prompt_ids_mismatched = int(state.get("prompt_ids_mismatched", 0))
        torch.set_rng_state(state["torch_rng"])


def _step_tokens(episode: EpisodeRecord, t: int) -> int:
    """Step ``t``'s length in the learner's forward pass: its prompt's ids and its action's (an event without prompt
    ids: its screen's characters, a fair proxy for sorting)."""
    step = episode.steps[t]
    prompt = len(step.prompt_token_ids) if step.prompt_token_ids is not None else len(step.observation)
    return prompt + len(step.token_ids)


def _batch_stats(version: int, versions: Tensor, mask: Tensor, success: Tensor) -> dict[str, float]:
    """Policy lag (``version`` − behaviour version) over the batch's steps, and its success rate."""
    lag = (version - versions[mask]).float()
    return {
        "batch_lag_mean": float(lag.mean()) if lag.numel() else 0.0,
        "batch_lag_max": float(lag.max()) if lag.numel() else 0.0,
        "batch_success": float(success.float().mean()) if success.numel() else 0.0,
    }


def _prefixed(prefix: str, stats: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}_{k}": v for k, v in stats.items() if math.isfinite(v)}
