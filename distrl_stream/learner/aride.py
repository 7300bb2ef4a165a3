"""A-RIDE, the learner's algorithm, as small pure torch functions (docs/design.md §5), plus the two baselines.

Read top to bottom against the paper. Notation: an episode τ = (s_0, a_0, r_0, …, s_{L-1}, a_{L-1}, r_{L-1}, s_L);
μ = behaviour policy (the version that acted), π = current policy, ρ_t = π(a_t|s_t) / μ(a_t|s_t) from the sequence
log-prob of the action's tokens, γ discount, V(s) the step critic (a success probability in [0, 1]).

Batch layout: B episodes, left-aligned and padded to T = the longest, ``[B, T]`` tensors with a boolean ``mask``
(True on real steps). Episodes here are short (10-20 steps) and the backward recursions run over T, vectorised over
the B episodes, so a padded layout costs less than it saves. Per-step quantities computed on the flat list of steps
(log-probs, entropies, values: ``[N]``, episode-major order) enter the layout with :func:`pad_steps`.

End of an episode: ``done[b, t]`` is 1 on a terminal step (success, or a ``status`` action); a truncated episode's
last step has ``done = 0`` and its value beyond the data, V(s_L), comes in ``bootstrap[b]`` (the trainer passes the
critic's value of the final observation the collector recorded, TrajectoryEvent v2; 0 for a v1 record without it).

Losses are averaged per episode first (mean over its steps), then over episodes, each weighted by its DPER
importance weight: an episode is the unit DPER samples, so an episode's weight must scale its whole contribution
regardless of its length.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# exp() of a larger log-ratio overflows float32; ρ is clipped by c̄ and ρ̄ wherever it is used for learning.
_MAX_LOG_RATIO = 20.0


# ----------------------------------------------------------------------------------------------------------------
# Layout helpers
# ----------------------------------------------------------------------------------------------------------------


def pad_steps(flat: Tensor, mask: Tensor) -> Tensor:
    """Scatter flat per-step values into the padded episode layout (differentiable).

    Args:
        flat: ``[N, ...]`` one row per real step, episode-major (episode 0's steps in order, then episode 1's, …).
        mask: ``[B, T]`` bool, True on real steps; ``mask.sum() == N``.

    Returns:
        ``[B, T, ...]`` with zeros on padding.
    """
    out = flat.new_zeros((*mask.shape, *flat.shape[1:]))
    out[mask] = flat
    return out


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the True positions of ``mask`` (0 when there are none)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def episode_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Per-episode mean over real steps: ``[B, T] -> [B]``."""
    m = mask.to(x.dtype)
    return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


def _weighted_episode_average(per_step: Tensor, mask: Tensor, episode_weights: Tensor | None) -> Tensor:
    """mean_b w_b · mean_t per_step[b, t] over the episodes with at least one step in ``mask`` (scalar).

    Every loss below reduces this way; the baselines' filters drop episodes by clearing their mask rows, so a
    dropped episode neither contributes nor dilutes the average.
    """
    per_episode = episode_mean(per_step, mask)
    if episode_weights is not None:
        per_episode = per_episode * episode_weights.to(per_episode.dtype)
    present = mask.any(dim=1).to(per_episode.dtype)
    return (per_episode * present).sum() / present.sum().clamp(min=1.0)


def next_values(values: Tensor, bootstrap: Tensor, mask: Tensor) -> Tensor:
    """V(s_{t+1}) for every step: the next step's value inside the episode, ``bootstrap`` after its last step.

    Args:
        values: ``[B, T]`` V(s_t).
        bootstrap: ``[B]`` V(s_L), the value after the last recorded step (used only where ``done`` is 0).
        mask: ``[B, T]`` bool.

    Returns:
        ``[B, T]`` (0 on padding).
    """
    shifted = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    lengths = mask.sum(dim=1)
    is_last = torch.zeros_like(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    has_steps = lengths > 0
    is_last[rows[has_steps], lengths[has_steps] - 1] = True
    out = torch.where(is_last, bootstrap.to(values.dtype)[:, None].expand_as(values), shifted)
    return out * mask.to(values.dtype)


def importance_ratios(logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:
    """ρ_t = π(a_t|s_t) / μ(a_t|s_t) = exp(log π − log μ), detached (a coefficient, never a gradient path).

    Args:
        logp: ``[B, T]`` log π(a_t|s_t), the sum over the action's tokens under the current policy.
        behaviour_logp: ``[B, T]`` log μ(a_t|s_t) as the collector recorded it.
        mask: ``[B, T]`` bool.

    Returns:
        ``[B, T]`` ρ (0 on padding). The log-ratio is capped at 20 so ρ stays finite.
    """
    log_ratio = (logp.detach() - behaviour_logp).clamp(max=_MAX_LOG_RATIO)
    return torch.exp(log_ratio) * mask.to(logp.dtype)


# ----------------------------------------------------------------------------------------------------------------
# Retrace(λ) value targets
# ----------------------------------------------------------------------------------------------------------------


def td_errors(rewards: Tensor, values: Tensor, bootstrap: Tensor, done: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """One-step TD errors δ_t = r_t + γ V(s_{t+1}) (1 − done_t) − V(s_t).

    Args:
        rewards: ``[B, T]`` r_t.
        values: ``[B, T]`` V(s_t).
        bootstrap: ``[B]`` V(s_L) after the last step.
        done: ``[B, T]`` 1 on terminal steps.
        mask: ``[B, T]`` bool.
        gamma: discount γ.

    Returns:
        ``[B, T]`` δ (0 on padding).
    """
    not_done = 1.0 - done.to(values.dtype)
    delta = rewards + gamma * next_values(values, bootstrap, mask) * not_done - values
    return delta * mask.to(values.dtype)


def retrace_targets(
    rewards: Tensor,
    values: Tensor,
    bootstrap: Tensor,
    done: Tensor,
    rhos: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    c_bar: float,
) -> Tensor:
    """Retrace(λ) state-value targets, computed backwards in O(L) per episode.

    c_i = λ · min(c̄, ρ_i)
    V^ret(s_t) = V(s_t) + Σ_{k≥t} γ^{k−t} (Π_{i=t+1}^{k} c_i) δ_k

    which is the backward recursion V^ret(s_t) − V(s_t) = δ_t + γ (1 − done_t) c_{t+1} (V^ret(s_{t+1}) − V(s_{t+1})),
    started from 0 after the episode's last step (the bootstrap value already sits in the last δ of a truncated
    episode). λ = 0 gives the one-step TD target; ρ = 1, λ = 1, c̄ ≥ 1 gives the discounted Monte-Carlo return
    (plus γ^{L−t} V(s_L) when truncated).

    Args:
        rewards: ``[B, T]`` r_t.
        values: ``[B, T]`` V(s_t) from the critic (treated as constants: the result is detached).
        bootstrap: ``[B]`` V(s_L) after the last step of each episode.
        done: ``[B, T]`` 1 on terminal steps.
        rhos: ``[B, T]`` ρ_t (see :func:`importance_ratios`).
        mask: ``[B, T]`` bool.
        gamma: discount γ.
        lam: trace decay λ.
        c_bar: trace truncation c̄.

    Returns:
        ``[B, T]`` V^ret(s_t), detached, 0 on padding.
    """
    values = values.detach()
    bootstrap = bootstrap.detach()
    m = mask.to(values.dtype)
    delta = td_errors(rewards, values, bootstrap, done, mask, gamma)
    traces = lam * rhos.detach().clamp(max=c_bar) * m  # c_t, [B, T]
    not_done = 1.0 - done.to(values.dtype)
    correction = torch.zeros_like(values)  # V^ret(s_t) − V(s_t)
    acc = values.new_zeros(values.shape[0])  # V^ret(s_{t+1}) − V(s_{t+1}); 0 past the end
    next_trace = values.new_zeros(values.shape[0])  # c_{t+1}; 0 past the end
    for t in reversed(range(values.shape[1])):
        acc = delta[:, t] + gamma * not_done[:, t] * next_trace * acc
        correction[:, t] = acc
        next_trace = traces[:, t]
    return ((values + correction) * m).detach()


def advantages(
    rewards: Tensor,
    values: Tensor,
    retrace: Tensor,
    bootstrap: Tensor,
    done: Tensor,
    mask: Tensor,
    gamma: float,
) -> Tensor:
    """A_t = r_t + γ V^ret(s_{t+1}) (1 − done_t) − V(s_t), detached.

    After the last recorded step V^ret(s_L) is the bootstrap value (no data beyond it to correct it with).

    Args:
        rewards: ``[B, T]`` r_t.
        values: ``[B, T]`` V(s_t).
        retrace: ``[B, T]`` V^ret(s_t) from :func:`retrace_targets`.
        bootstrap: ``[B]`` V(s_L).
        done: ``[B, T]`` 1 on terminal steps.
        mask: ``[B, T]`` bool.
        gamma: discount γ.

    Returns:
        ``[B, T]`` A_t (0 on padding).
    """
    values = values.detach()
    not_done = 1.0 - done.to(values.dtype)
    adv = rewards + gamma * next_values(retrace.detach(), bootstrap.detach(), mask) * not_done - values
    return (adv * mask.to(values.dtype)).detach()


# ----------------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------------


def critic_loss(
    value_logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    episode_weights: Tensor | None = None,
    kind: Literal["bce", "mse"] = "bce",
) -> Tensor:
    """Critic loss towards the Retrace targets (the targets are detached; only V learns).

    ``bce``: binary cross-entropy between σ(logit) and the target clipped to [0, 1] — V is a success probability,
    and BCE keeps its gradient from vanishing where the sigmoid saturates (MSE through a sigmoid does not).
    ``mse``: (σ(logit) − clip(V^ret, 0, 1))².

    Args:
        value_logits: ``[B, T]`` critic logits for s_t (V = σ(logit)); carries the gradient.
        targets: ``[B, T]`` V^ret(s_t).
        mask: ``[B, T]`` bool.
        episode_weights: ``[B]`` DPER importance weights, or None for 1.
        kind: ``"bce"`` or ``"mse"``.

    Returns:
        Scalar loss.
    """
    target = targets.detach().clamp(0.0, 1.0)
    if kind == "bce":
        per_step = F.binary_cross_entropy_with_logits(value_logits, target, reduction="none")
    elif kind == "mse":
        per_step = (torch.sigmoid(value_logits) - target) ** 2
    else:
        raise ValueError(f"critic loss kind must be 'bce' or 'mse', got {kind!r}")
    return _weighted_episode_average(per_step, mask, episode_weights)


class PolicyLoss(NamedTuple):
    """The policy loss and its three terms (each already averaged as the loss is), for metrics."""

    loss: Tensor
    pg: Tensor
    entropy: Tensor
    invalid: Tensor


def policy_loss(
    logp: Tensor,
    rhos: Tensor,
    advantages: Tensor,
    entropy: Tensor,
    invalid: Tensor,
    mask: Tensor,
    rho_bar: float,
    beta: float,
    lambda_inv: float,
    episode_weights: Tensor | None = None,
) -> PolicyLoss:
    """A-RIDE policy loss.

    L_π = −E[min(ρ̄, ρ_t) · A_t · log π(a_t|s_t)] − β · E[H(π(·|s_t))] + λ_inv · E[1{a_t invalid} · log π(a_t|s_t)]

    The importance weight and the advantage are constants; the gradient flows through log π and H. The invalid term
    lowers the probability of actions the env/validator rejected.

    Args:
        logp: ``[B, T]`` log π(a_t|s_t) with gradient (sum over the action's tokens).
        rhos: ``[B, T]`` ρ_t.
        advantages: ``[B, T]`` A_t.
        entropy: ``[B, T]`` per-token entropy of π over the action's positions (mean over them), with gradient.
        invalid: ``[B, T]`` bool, True where the action was invalid.
        mask: ``[B, T]`` bool.
        rho_bar: ρ̄, the clip of the importance weight.
        beta: entropy coefficient β.
        lambda_inv: invalid-action penalty λ_inv.
        episode_weights: ``[B]`` DPER importance weights, or None for 1.

    Returns:
        :class:`PolicyLoss` (scalar tensors).
    """
    rhos, advantages = rhos.detach(), advantages.detach()
    coeff = rhos.clamp(max=rho_bar) * advantages
    pg = _weighted_episode_average(-coeff * logp, mask, episode_weights)
    ent = _weighted_episode_average(entropy, mask, episode_weights)
    inv = _weighted_episode_average(invalid.to(logp.dtype) * logp, mask, episode_weights)
    return PolicyLoss(loss=pg - beta * ent + lambda_inv * inv, pg=pg, entropy=ent, invalid=inv)


# ----------------------------------------------------------------------------------------------------------------
# Statistics for metrics
# ----------------------------------------------------------------------------------------------------------------


def rho_stats(rhos: Tensor, mask: Tensor, rho_bar: float) -> dict[str, float]:
    """Mean and max ρ over real steps and the fraction clipped by ρ̄ (ρ > ρ̄)."""
    real = rhos[mask]
    if real.numel() == 0:
        return {"rho_mean": 0.0, "rho_max": 0.0, "rho_clipped_frac": 0.0}
    return {
        "rho_mean": float(real.mean()),
        "rho_max": float(real.max()),
        "rho_clipped_frac": float((real > rho_bar).float().mean()),
    }


def masked_stats(x: Tensor, mask: Tensor) -> dict[str, float]:
    """mean / std / min / max of ``x`` over real steps (all 0 when there are none)."""
    real = x.detach()[mask].float()
    if real.numel() == 0:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    std = float(real.std()) if real.numel() > 1 else 0.0
    return {"mean": float(real.mean()), "std": std, "min": float(real.min()), "max": float(real.max())}


# ----------------------------------------------------------------------------------------------------------------
# Baseline: DigiRL-style filtered advantage-weighted updates
# ----------------------------------------------------------------------------------------------------------------


def digirl_step_advantages(
    rewards: Tensor,
    values: Tensor,
    bootstrap: Tensor,
    done: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
) -> Tensor:
    """DigiRL's doubly-robust step advantage, binarised.

    A_t = λ^{L−1−t} · R(τ) + (1 − λ^{L−1−t}) · δ_t, with R(τ) = Σ_k r_k the episode return and δ_t the one-step TD
    error; the update uses 1{A_t > 0} (hard filter, as DigiRL's advantage-weighted regression does).

    Args:
        rewards: ``[B, T]`` r_t.
        values: ``[B, T]`` V(s_t) from the step critic.
        bootstrap: ``[B]`` V(s_L).
        done: ``[B, T]`` 1 on terminal steps.
        mask: ``[B, T]`` bool.
        gamma: discount γ of the TD error.
        lam: DigiRL's λ mixing the Monte-Carlo outcome and the TD error.

    Returns:
        ``[B, T]`` float 0/1 (0 on padding).
    """
    m = mask.to(values.dtype)
    delta = td_errors(rewards, values.detach(), bootstrap.detach(), done, mask, gamma)
    steps_to_go = (mask.sum(dim=1, keepdim=True) - 1 - torch.arange(mask.shape[1], device=mask.device)).clamp(min=0)
    mix = lam ** steps_to_go.to(values.dtype)
    episode_return = (rewards * m).sum(dim=1, keepdim=True)
    adv = mix * episode_return + (1.0 - mix) * delta
    return (adv > 0).to(values.dtype) * m


def trajectory_advantages(success: Tensor, trajectory_values: Tensor) -> Tensor:
    """DigiRL's instruction-level advantage: 1{success} − V_traj(instruction), ``[B]``."""
    return success.to(trajectory_values.dtype) - trajectory_values.detach()


def top_quantile_mask(scores: Tensor, quantile: float) -> Tensor:
    """Keep the items whose score is at or above the ``quantile`` of ``scores`` (``[N] -> [N]`` bool)."""
    if scores.numel() == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    cutoff = torch.quantile(scores.float(), quantile)
    return scores >= cutoff


def digirl_policy_loss(
    logp: Tensor,
    step_advantages: Tensor,
    mask: Tensor,
    keep: Tensor,
    episode_weights: Tensor | None = None,
) -> Tensor:
    """DigiRL-style loss: −E[1{A_t > 0} · log π(a_t|s_t)] over the episodes the trajectory filter kept.

    Args:
        logp: ``[B, T]`` log π(a_t|s_t) with gradient.
        step_advantages: ``[B, T]`` binarised advantages from :func:`digirl_step_advantages`.
        mask: ``[B, T]`` bool.
        keep: ``[B]`` bool, the episodes that passed :func:`top_quantile_mask` on trajectory advantages.
        episode_weights: ``[B]`` optional importance weights.

    Returns:
        Scalar loss (0, still differentiable, when nothing is kept).
    """
    return _weighted_episode_average(-step_advantages.detach() * logp, mask & keep[:, None], episode_weights)


# ----------------------------------------------------------------------------------------------------------------
# Baseline: filtered behaviour cloning
# ----------------------------------------------------------------------------------------------------------------


def filtered_bc_loss(logp: Tensor, mask: Tensor, success: Tensor, episode_weights: Tensor | None = None) -> Tensor:
    """Filtered behaviour cloning: −E[log π(a_t|s_t)] over the steps of successful episodes only.

    Args:
        logp: ``[B, T]`` log π(a_t|s_t) with gradient.
        mask: ``[B, T]`` bool.
        success: ``[B]`` bool episode success.
        episode_weights: ``[B]`` optional importance weights.

    Returns:
        Scalar loss (0, still differentiable, when no episode succeeded).
    """
    return _weighted_episode_average(-logp, mask & success.bool()[:, None], episode_weights)


def mismatch_stats(logp: Tensor, behaviour_logp: Tensor, same_weights: Tensor, mask: Tensor) -> dict[str, float]:
    """|log π − log μ| over the steps whose behaviour weights are the ones log π was computed with: the gap between
    the learner's and the server's arithmetic alone (precision, kernels), no staleness in it. ρ clipping and Retrace's
    c̄ bound what it can do to an update (docs/learner.md, "Precision").

    Args:
        logp, behaviour_logp: ``[B, T]`` log π and log μ of each step's action.
        same_weights: ``[B, T]`` True where the acting version's weights are the learner's current ones.
        mask: ``[B, T]`` real steps.

    Returns:
        ``logp_mismatch_mean`` / ``_max`` (nats) and ``logp_mismatch_steps``; empty when no step qualifies.
    """
    where = mask & same_weights
    if not bool(where.any()):
        return {}
    gap = (logp.detach() - behaviour_logp)[where].abs()
    return {
        "logp_mismatch_mean": float(gap.mean()),
        "logp_mismatch_max": float(gap.max()),
        "logp_mismatch_steps": float(where.sum()),
    }
