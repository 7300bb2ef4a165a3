"""A-RIDE maths on hand-computed numbers (docs/design.md §5)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distrl_stream.learner import aride

torch.set_num_threads(1)


def batch(*episodes: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned [B, T] tensor and mask from per-episode lists."""
    t = max(len(e) for e in episodes)
    x = torch.zeros(len(episodes), t)
    mask = torch.zeros(len(episodes), t, dtype=torch.bool)
    for i, e in enumerate(episodes):
        x[i, : len(e)] = torch.tensor(e)
        mask[i, : len(e)] = True
    return x, mask


# The 3-step example: γ = 0.5, λ = 1, c̄ = 1; ρ_1 = 2 is truncated to c_1 = 1; ρ_0 never enters (c starts at t+1).
REWARDS = [0.0, 0.0, 1.0]
VALUES = [0.2, 0.4, 0.6]
DONE = [0.0, 0.0, 1.0]
RHOS = [0.5, 2.0, 0.8]
# δ = [0 + .5·.4 − .2, 0 + .5·.6 − .4, 1 − .6] = [0, −.1, .4]
# V^ret_2 = .6 + .4 = 1; V^ret_1 = .4 − .1 + .5·.8·.4 = .46; V^ret_0 = .2 + 0 + .5·1·(−.1) + .25·1·.8·.4 = .23
RETRACE = [0.23, 0.46, 1.0]
# A_t = r_t + γ V^ret_{t+1} (1 − done_t) − V_t
ADVANTAGES = [0.5 * 0.46 - 0.2, 0.5 * 1.0 - 0.4, 1.0 - 0.6]


def test_three_step_example_matches_hand_computation_number_by_number() -> None:
    r, mask = batch(REWARDS)
    v, _ = batch(VALUES)
    done, _ = batch(DONE)
    rho, _ = batch(RHOS)
    boot = torch.zeros(1)
    delta = aride.td_errors(r, v, boot, done, mask, gamma=0.5)
    assert delta[0].tolist() == pytest.approx([0.0, -0.1, 0.4], abs=1e-6)
    ret = aride.retrace_targets(r, v, boot, done, rho, mask, gamma=0.5, lam=1.0, c_bar=1.0)
    assert ret[0].tolist() == pytest.approx(RETRACE, abs=1e-6)
    adv = aride.advantages(r, v, ret, boot, done, mask, gamma=0.5)
    assert adv[0].tolist() == pytest.approx(ADVANTAGES, abs=1e-6)


def test_first_ratio_of_an_episode_does_not_enter_its_own_target() -> None:
    r, mask = batch(REWARDS)
    v, _ = batch(VALUES)
    done, _ = batch(DONE)
    rho_a, _ = batch([0.01, 2.0, 0.8])
    rho_b, _ = batch([9.0, 2.0, 0.8])
    args = dict(gamma=0.5, lam=1.0, c_bar=1.0)
    a = aride.retrace_targets(r, v, torch.zeros(1), done, rho_a, mask, **args)
    b = aride.retrace_targets(r, v, torch.zeros(1), done, rho_b, mask, **args)
    assert torch.allclose(a, b)


def test_retrace_with_lambda_zero_equals_one_step_td_targets() -> None:
    gen = torch.Generator().manual_seed(0)
    r, mask = batch([0.0, 0.0, 0.0, 1.0], [0.0, 0.0], [0.0, 0.0, 0.0])
    done, _ = batch([0, 0, 0, 1], [0, 1], [0, 0, 0])  # the third is truncated
    v = torch.rand(r.shape, generator=gen) * mask
    rho = torch.rand(r.shape, generator=gen) * 3
    boot = torch.tensor([0.0, 0.0, 0.7])
    gamma = 0.9
    ret = aride.retrace_targets(r, v, boot, done, rho, mask, gamma=gamma, lam=0.0, c_bar=1.0)
    for b, n in enumerate(mask.sum(1).tolist()):
        for t in range(n):
            v_next = boot[b] if t == n - 1 else v[b, t + 1]
            expected = r[b, t] + gamma * v_next * (1 - done[b, t])
            assert ret[b, t].item() == pytest.approx(expected.item(), abs=1e-6)
    assert (ret[~mask] == 0).all()


def test_on_policy_retrace_with_lambda_one_is_the_monte_carlo_return_whatever_the_critic() -> None:
    gamma = 0.5
    r, mask = batch([0.0, 0.2, 0.0, 1.0], [0.0, 0.5, 0.0])
    done, _ = batch([0, 0, 0, 1], [0, 0, 0])  # episode 1 is truncated: + γ^{L−t} V(s_L)
    boot = torch.tensor([0.0, 0.8])
    rho = torch.ones_like(r)
    expected = [
        [0.2 * 0.5 + 1.0 * 0.125, 0.2 + 1.0 * 0.25, 1.0 * 0.5, 1.0],
        [0.5 * 0.5 + 0.8 * 0.125, 0.5 + 0.8 * 0.25, 0.8 * 0.5],
    ]
    for seed in (0, 1):
        v = torch.rand(r.shape, generator=torch.Generator().manual_seed(seed))
        ret = aride.retrace_targets(r, v, boot, done, rho, mask, gamma=gamma, lam=1.0, c_bar=1.0)
        assert ret[0].tolist() == pytest.approx(expected[0], abs=1e-6)
        assert ret[1, :3].tolist() == pytest.approx(expected[1], abs=1e-6)


def test_traces_are_truncated_at_c_bar() -> None:
    r, mask = batch(REWARDS)
    v, _ = batch(VALUES)
    done, _ = batch(DONE)
    big, _ = batch([3.0, 3.0, 3.0])
    args = dict(gamma=0.5, lam=1.0)
    at_one = aride.retrace_targets(r, v, torch.zeros(1), done, torch.ones_like(r), mask, c_bar=1.0, **args)
    clipped = aride.retrace_targets(r, v, torch.zeros(1), done, big, mask, c_bar=1.0, **args)
    assert torch.allclose(at_one, clipped)  # ρ = 3 traces as ρ = 1 when c̄ = 1
    # c̄ = 0.5: c = [.5, .5, .5]; V^ret_1 = .4 − .1 + .5·.5·.4 = .4; V^ret_0 = .2 + .5·.5·(−.1) + .25·.25·.4 = .2
    half = aride.retrace_targets(r, v, torch.zeros(1), done, big, mask, c_bar=0.5, **args)
    assert half[0].tolist() == pytest.approx([0.2, 0.4, 1.0], abs=1e-6)


def test_truncated_episode_bootstraps_and_padding_does_not_leak() -> None:
    # Episode 1: r = [0, 0], V = [.5, .3], not done, V(s_L) = .8, on-policy: V^ret = [γ²·.8, γ·.8] = [.2, .4].
    r, mask = batch(REWARDS, [0.0, 0.0])
    v, _ = batch(VALUES, [0.5, 0.3])
    done, _ = batch(DONE, [0.0, 0.0])
    rho, _ = batch(RHOS, [1.0, 1.0])
    boot = torch.tensor([0.0, 0.8])
    ret = aride.retrace_targets(r, v, boot, done, rho, mask, gamma=0.5, lam=1.0, c_bar=1.0)
    assert ret[0].tolist() == pytest.approx(RETRACE, abs=1e-6)
    assert ret[1].tolist() == pytest.approx([0.2, 0.4, 0.0], abs=1e-6)
    adv = aride.advantages(r, v, ret, boot, done, mask, gamma=0.5)
    assert adv[1].tolist() == pytest.approx([0.5 * 0.4 - 0.5, 0.5 * 0.8 - 0.3, 0.0], abs=1e-6)


def test_targets_and_advantages_carry_no_gradient() -> None:
    r, mask = batch(REWARDS)
    v, _ = batch(VALUES)
    v.requires_grad_(True)
    done, _ = batch(DONE)
    ret = aride.retrace_targets(r, v, torch.zeros(1), done, torch.ones_like(r), mask, gamma=0.5, lam=1.0, c_bar=1.0)
    adv = aride.advantages(r, v, ret, torch.zeros(1), done, mask, gamma=0.5)
    assert not ret.requires_grad and not adv.requires_grad


def test_importance_ratios_are_exp_of_log_ratio_and_finite() -> None:
    logp, mask = batch([-1.0, -0.5, 0.0])
    mu, _ = batch([-2.0, -0.5, -100.0])
    rho = aride.importance_ratios(logp, mu, mask)
    assert rho[0, :2].tolist() == pytest.approx([torch.e, 1.0], rel=1e-6)
    assert torch.isfinite(rho).all()


# ---- policy loss on a small real model ---------------------------------------------------------------------------


class LinearPolicy(nn.Module):
    """π(a|s) = softmax(W s): a real torch policy over 4 actions."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 4)

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        return self.linear(s)

    def logp_and_entropy(self, s: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = torch.log_softmax(self.logits(s), dim=-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp_all.gather(-1, a[:, None]).squeeze(-1), entropy


STATES = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, -0.5]])
ACTIONS = torch.tensor([2, 1])
MASK = torch.ones(1, 2, dtype=torch.bool)  # one episode of two steps


def one_step(advantage: float, *, invalid: bool = False, beta: float = 0.0, lambda_inv: float = 0.0) -> tuple:
    """(log π and entropy before, after) one SGD step on the A-RIDE loss."""
    policy = LinearPolicy()
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    logp, ent = policy.logp_and_entropy(STATES, ACTIONS)
    out = aride.policy_loss(
        logp=logp[None],
        rhos=torch.ones(1, 2),
        advantages=torch.full((1, 2), advantage),
        entropy=ent[None],
        invalid=torch.full((1, 2), invalid),
        mask=MASK,
        rho_bar=1.0,
        beta=beta,
        lambda_inv=lambda_inv,
    )
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    with torch.no_grad():
        logp_after, ent_after = policy.logp_and_entropy(STATES, ACTIONS)
    return logp.detach(), logp_after, ent.detach(), ent_after


def test_positive_advantage_raises_log_prob_after_one_step() -> None:
    before, after, _, _ = one_step(advantage=1.0)
    assert (after > before).all()


def test_negative_advantage_lowers_log_prob_after_one_step() -> None:
    before, after, _, _ = one_step(advantage=-1.0)
    assert (after < before).all()


def test_invalid_action_probability_falls_under_the_penalty() -> None:
    before, after, _, _ = one_step(advantage=0.0, invalid=True, lambda_inv=1.0)
    assert (after < before).all()
    same_before, same_after, _, _ = one_step(advantage=0.0, invalid=False, lambda_inv=1.0)
    assert torch.allclose(same_before, same_after)  # valid actions are untouched by λ_inv


def test_entropy_bonus_raises_entropy_after_one_step() -> None:
    _, _, ent_before, ent_after = one_step(advantage=0.0, beta=1.0)
    assert (ent_after > ent_before).all()


def test_policy_loss_terms_combine_as_the_equation_says() -> None:
    logp, mask = batch([-1.0, -2.0], [-0.5])
    rho, _ = batch([0.5, 3.0], [1.0])
    adv, _ = batch([1.0, -1.0], [2.0])
    ent, _ = batch([0.3, 0.1], [0.2])
    invalid = torch.tensor([[False, True], [True, False]])
    weights = torch.tensor([2.0, 0.5])
    out = aride.policy_loss(logp, rho, adv, ent, invalid, mask, rho_bar=1.0, beta=0.1, lambda_inv=0.2,
                            episode_weights=weights)  # fmt: skip
    # Episode 0: pg steps −.5·1·(−1) = .5 and −1·(−1)·(−2) = −2 → mean −.75; episode 1: −1·2·(−.5) = 1.
    pg = (2.0 * -0.75 + 0.5 * 1.0) / 2
    entropy = (2.0 * 0.2 + 0.5 * 0.2) / 2
    inv = (2.0 * (-2.0 / 2) + 0.5 * -0.5) / 2
    assert out.pg.item() == pytest.approx(pg)
    assert out.entropy.item() == pytest.approx(entropy)
    assert out.invalid.item() == pytest.approx(inv)
    assert out.loss.item() == pytest.approx(pg - 0.1 * entropy + 0.2 * inv)


def test_episode_weights_scale_whole_episodes_whatever_their_length() -> None:
    logp, mask = batch([-1.0, -1.0, -1.0, -1.0], [-1.0])
    adv = torch.ones_like(logp)
    args = dict(rhos=torch.ones_like(logp), advantages=adv, entropy=torch.zeros_like(logp),
                invalid=torch.zeros_like(mask), mask=mask, rho_bar=1.0, beta=0.0, lambda_inv=0.0)  # fmt: skip
    only_long = aride.policy_loss(logp, episode_weights=torch.tensor([1.0, 0.0]), **args).loss
    only_short = aride.policy_loss(logp, episode_weights=torch.tensor([0.0, 1.0]), **args).loss
    assert only_long.item() == pytest.approx(only_short.item())  # each episode is one unit


def test_critic_loss_is_bce_towards_the_clipped_target_and_trains_v_towards_it() -> None:
    target, mask = batch([1.3, 0.4], [-0.2])
    logits = torch.zeros_like(target, requires_grad=True)
    loss = aride.critic_loss(logits, target, mask, kind="bce")
    ln2 = torch.log(torch.tensor(2.0)).item()
    assert loss.item() == pytest.approx(ln2)  # σ(0) = .5 against any target in [0, 1]: BCE = ln 2
    opt = torch.optim.SGD([logits], lr=5.0)
    for _ in range(200):
        opt.zero_grad()
        aride.critic_loss(logits, target, mask, kind="bce").backward()
        opt.step()
    v = torch.sigmoid(logits.detach())
    assert v[0, 0].item() > 0.95 and abs(v[0, 1].item() - 0.4) < 0.02 and v[1, 0].item() < 0.05


def test_critic_mse_loss_value() -> None:
    target, mask = batch([1.0, 0.0])
    loss = aride.critic_loss(torch.zeros_like(target), target, mask, kind="mse")
    assert loss.item() == pytest.approx(0.25)


# ---- statistics --------------------------------------------------------------------------------------------------


def test_rho_stats_counts_clipped_fraction() -> None:
    rho, mask = batch([0.5, 2.0, 1.0], [4.0])
    stats = aride.rho_stats(rho, mask, rho_bar=1.0)
    assert stats == pytest.approx({"rho_mean": 7.5 / 4, "rho_max": 4.0, "rho_clipped_frac": 0.5})


def test_pad_steps_places_flat_steps_episode_major_and_keeps_gradient() -> None:
    flat = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    _, mask = batch([0, 0, 0], [0])
    padded = aride.pad_steps(flat, mask)
    assert padded.tolist() == [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
    padded.sum().backward()
    assert flat.grad is not None and flat.grad.tolist() == [1.0, 1.0, 1.0, 1.0]


# ---- baselines ---------------------------------------------------------------------------------------------------


def test_digirl_step_advantage_mixes_outcome_and_td_error_then_binarises() -> None:
    # Episode 0 succeeds (R = 1); episode 1 fails with V rising then falling.
    r, mask = batch([0.0, 0.0, 1.0], [0.0, 0.0])
    v, _ = batch([0.5, 0.5, 0.5], [0.2, 0.6])
    done, _ = batch([0, 0, 1], [0, 1])
    adv = aride.digirl_step_advantages(r, v, torch.zeros(2), done, mask, gamma=1.0, lam=0.5)
    # Episode 0: λ^{2−t}·1 + (1−λ^{2−t})·δ_t, δ = [0, 0, .5] → [.25, .5, 1] > 0.
    # Episode 1: δ = [.6 − .2, 0 − .6] = [.4, −.6]; A_0 = .5·0 + .5·.4 = .2 > 0; A_1 = 1·0 + 0·δ = 0 → not > 0.
    assert adv.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


def test_top_quantile_filter_keeps_the_best_trajectories() -> None:
    success = torch.tensor([1, 0, 1, 0, 1, 0, 0, 0, 0, 1])
    v_traj = torch.tensor([0.9, 0.1, 0.2, 0.5, 0.6, 0.0, 0.3, 0.2, 0.1, 0.95])
    scores = aride.trajectory_advantages(success, v_traj)  # best: task 2 (0.8), then task 4 (0.4)
    assert aride.top_quantile_mask(scores, 0.9).nonzero().flatten().tolist() == [2]
    assert aride.top_quantile_mask(scores, 0.8).nonzero().flatten().tolist() == [2, 4]


def test_digirl_loss_ignores_filtered_out_episodes() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss = aride.digirl_policy_loss(logp, adv, mask, keep=torch.tensor([True, False]))
    assert loss.item() == pytest.approx(0.5)  # −(1·(−1) + 0·(−2)) / 2, episode 1 dropped
    loss.backward()
    assert logp.grad is not None and logp.grad[1].abs().sum() == 0 and logp.grad[0, 0] < 0


def test_filtered_bc_imitates_successful_episodes_only() -> None:
    logp = torch.tensor([[-1.0, -3.0], [-5.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss = aride.filtered_bc_loss(logp, mask, success=torch.tensor([True, False]))
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert logp.grad is not None and logp.grad[1].abs().sum() == 0 and (logp.grad[0] < 0).all()
    nothing = aride.filtered_bc_loss(logp, mask, success=torch.tensor([False, False]))
    assert nothing.item() == 0.0 and nothing.requires_grad
