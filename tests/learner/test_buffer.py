"""Replay buffer and DPER: storage, eviction, proportional sampling, IS weights, priorities, snapshots."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl_stream.errors import ReplayBufferError
from distrl_stream.learner import aride
from distrl_stream.learner.buffer import ReplayBuffer, SumTree, is_beta, trajectory_priorities
from distrl_stream.learner.records import EpisodeRecord, StepRecord, collate

torch.set_num_threads(1)


def episode(n: int, name: str = "ep", *, success: bool = True, terminal: bool = True) -> EpisodeRecord:
    """An episode of ``n`` steps; the last is done when ``terminal``; rewards 1 on success at the end."""
    steps = tuple(
        StepRecord(
            observation=f"{name} screen {t}",
            candidates=('{"action_type":"click","index":1}', '{"action_type":"navigate_back"}'),
            action_text='{"action_type":"click","index":1}',
            action='{"action_type":"click","index":1}' if t != 1 else "",
            valid=t != 1,
            reward=1.0 if (success and terminal and t == n - 1) else 0.0,
            done=terminal and t == n - 1,
            behaviour_logprob=-0.1 * (t + 1),
            token_ids=(5, 6, t),
            token_logprobs=(-0.05, -0.05 * (t + 1), 0.0),
            policy_version=t % 3,
        )
        for t in range(n)
    )
    return EpisodeRecord(
        episode_id=name,
        task_id=f"task-{name}",
        instruction=f"do {name}",
        success=success and terminal,
        termination="success" if (success and terminal) else ("failure" if terminal else "truncated"),
        steps=steps,
    )


# ---- storage and eviction ----------------------------------------------------------------------------------------


def test_wrap_around_evicts_whole_oldest_episodes_and_keeps_boundaries() -> None:
    buf = ReplayBuffer(capacity=10, seed=0)
    k0 = buf.add(episode(4, "a"))  # slots 0-3
    k1 = buf.add(episode(3, "b"))  # slots 4-6
    k2 = buf.add(episode(4, "c"))  # slots 7, 8, 9, 0: overwrites slot 0, so all of "a" goes
    assert buf.keys() == [k1, k2]
    assert buf.slots(k2) == [7, 8, 9, 0]
    assert buf.num_steps == 7 and buf.episodes_evicted == 1
    k3 = buf.add(episode(2, "d"))  # slots 1-2, freed by "a": nothing evicted
    assert buf.keys() == [k1, k2, k3] and buf.episodes_evicted == 1
    k4 = buf.add(episode(3, "e"))  # slots 3-5: takes slots of "b", which goes whole
    assert buf.keys() == [k2, k3, k4]
    assert buf.slots(k4) == [3, 4, 5] and buf.num_steps == 9
    assert k0 not in buf and k1 not in buf
    sample = buf.sample(50, beta=1.0)
    for key, ep in zip(sample.keys, sample.episodes, strict=True):
        assert ep == buf.get(key) and ep.steps[-1].done and not any(s.done for s in ep.steps[:-1])


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 30), lengths=st.lists(st.integers(1, 30), min_size=1, max_size=40))
def test_any_insertion_sequence_keeps_the_newest_whole_episodes_in_disjoint_slots(
    capacity: int, lengths: list[int]
) -> None:
    buf = ReplayBuffer(capacity=capacity, seed=0)
    added: list[int] = []
    for i, n in enumerate(lengths):
        if n > capacity:
            with pytest.raises(ReplayBufferError):
                buf.add(episode(n, f"e{i}"))
            continue
        added.append(buf.add(episode(n, f"e{i}")))
    held = buf.keys()
    if added:
        assert held == added[len(added) - len(held) :]  # a suffix: only the oldest were evicted
        assert held[-1] == added[-1]
    slots = [s for k in held for s in buf.slots(k)]
    assert len(slots) == len(set(slots)) == buf.num_steps <= capacity
    for k in held:  # consecutive slots modulo capacity, one per step
        first = buf.slots(k)[0]
        assert buf.slots(k) == [(first + i) % capacity for i in range(len(buf.get(k)))]
    assert buf.episodes_evicted == len(added) - len(held)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (EpisodeRecord("x", "t", "i", False, "failure", ()), "no steps"),
        (episode(11, "long"), "more than the buffer"),
        (
            EpisodeRecord("x", "t", "i", True, "success", (episode(2).steps[1], episode(2).steps[0])),
            "done step before",
        ),
    ],
)
def test_unstorable_episodes_are_refused_with_a_typed_error(bad: EpisodeRecord, reason: str) -> None:
    buf = ReplayBuffer(capacity=10)
    with pytest.raises(ReplayBufferError, match=reason):
        buf.add(bad)
    assert len(buf) == 0 and buf.num_steps == 0


def test_remove_drops_episodes_and_frees_their_slots() -> None:
    buf = ReplayBuffer(capacity=10, seed=0)
    keys = [buf.add(episode(3, n)) for n in "abc"]
    removed = buf.remove([keys[1], 999])
    assert [e.episode_id for e in removed] == ["b"] and buf.keys() == [keys[0], keys[2]] and buf.num_steps == 6
    assert set(buf.sample(200, beta=1.0).keys) == {keys[0], keys[2]}


# ---- DPER sampling -----------------------------------------------------------------------------------------------


def test_dper_samples_match_p_alpha_over_sum_p_alpha_chi_square_on_20k_draws() -> None:
    alpha = 0.5
    buf = ReplayBuffer(capacity=200, alpha=alpha, seed=1)
    keys = [buf.add(episode(1 + i % 4, f"e{i}")) for i in range(10)]
    priorities = np.array([0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 0.3, 64.0])
    buf.update_priorities(keys, priorities)
    draws = 20_000
    counts = np.zeros(len(keys))
    for _ in range(draws // 500):
        for k in buf.sample(500, beta=0.4).keys:
            counts[keys.index(k)] += 1
    expected_p = priorities**alpha / (priorities**alpha).sum()
    chi2 = float((((counts - draws * expected_p) ** 2) / (draws * expected_p)).sum())
    assert chi2 < 27.88  # χ² critical value, 9 degrees of freedom, p = 0.001
    uniform = np.full(len(keys), draws / len(keys))
    assert float((((counts - uniform) ** 2) / uniform).sum()) > 1000  # and clearly not uniform


def test_is_weights_are_n_p_to_the_minus_beta_normalised_by_the_max() -> None:
    buf = ReplayBuffer(capacity=10, alpha=1.0, seed=0)
    k_low, k_high = buf.add(episode(2, "low")), buf.add(episode(2, "high"))
    buf.update_priorities([k_low, k_high], [1.0, 4.0])
    sample = buf.sample(400, beta=1.0)
    # P = [.2, .8]; (N·P)^(−1) = [2.5, .625]; / max → [1, .25]
    expected = {k_low: (0.2, 1.0), k_high: (0.8, 0.25)}
    for key, p, w in zip(sample.keys, sample.probabilities, sample.is_weights.tolist(), strict=True):
        assert p == pytest.approx(expected[key][0]) and w == pytest.approx(expected[key][1])
    assert {k_low, k_high} == set(sample.keys)
    half = buf.sample(50, beta=0.5)  # β = .5: (N·P)^(−.5) = [1.581, .791] / 1.581 → [1, .5]
    for key, w in zip(half.keys, half.is_weights.tolist(), strict=True):
        assert w == pytest.approx(1.0 if key == k_low else 0.5)


def test_new_episodes_enter_at_the_current_max_priority() -> None:
    buf = ReplayBuffer(capacity=20, seed=0)
    first = buf.add(episode(2, "a"))
    assert buf.priority(first) == 1.0
    buf.update_priorities([first], [7.5])
    second = buf.add(episode(2, "b"))
    assert buf.priority(second) == 7.5
    buf.update_priorities([first, second], [0.2, 3.0])
    assert buf.priority(buf.add(episode(2, "c"))) == 3.0


def test_stats_say_how_far_dper_leans_towards_successes() -> None:
    buf = ReplayBuffer(capacity=100, alpha=0.5, seed=0)
    assert buf.stats()["buffer_success"] == 0.0 and buf.stats()["priority_success_share"] == 0.0
    keys = [buf.add(episode(2, f"e{i}", success=i == 0)) for i in range(4)]
    buf.update_priorities(keys, [9.0, 1.0, 1.0, 1.0])
    stats = buf.stats()
    assert stats["buffer_success"] == 0.25  # one of four stored
    assert stats["priority_success_share"] == pytest.approx(3.0 / 6.0)  # sqrt(9) of sqrt(9) + 3 × sqrt(1)
    draws = buf.sample(4000, beta=0.4).keys
    assert abs(draws.count(keys[0]) / len(draws) - 0.5) < 0.05  # what the sampler does


def test_priority_updates_skip_evicted_episodes_and_refuse_bad_values() -> None:
    buf = ReplayBuffer(capacity=4, seed=0)
    old = buf.add(episode(3, "old"))
    new = buf.add(episode(3, "new"))  # evicts "old"
    assert buf.update_priorities([old, new], [5.0, 2.0]) == 1
    assert buf.priority(new) == 2.0
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ReplayBufferError, match="finite"):
            buf.update_priorities([new], [bad])
    with pytest.raises(ReplayBufferError, match="keys but"):
        buf.update_priorities([new], [1.0, 2.0])


def test_trajectory_priority_is_w1_td_plus_w2_rho_plus_w3_surprise() -> None:
    mask = torch.tensor([[True, True], [True, False]])
    deltas = torch.tensor([[0.2, -0.4], [0.1, 9.0]])
    rhos = torch.tensor([[1.0, 3.0], [0.5, 9.0]])
    logp = torch.tensor([[-1.0, -3.0], [-0.5, 9.0]])
    p = trajectory_priorities(deltas, rhos, logp, mask, w1=50.0, w2=1.0, w3=0.01)
    assert p.tolist() == pytest.approx([50 * 0.3 + 2.0 + 0.01 * 2.0, 50 * 0.1 + 0.5 + 0.01 * 0.5])


def test_refreshing_the_whole_buffer_rescores_every_episode_and_changes_sampling() -> None:
    buf = ReplayBuffer(capacity=100, alpha=1.0, seed=3)
    keys = [buf.add(episode(2 + i % 3, f"e{i}")) for i in range(12)]
    seen: list[int] = []

    def score(chunk: list[int], episodes: list[EpisodeRecord]) -> torch.Tensor:
        seen.extend(chunk)
        # A real scorer: TD errors of a constant critic, current ρ = 1, entropy from the behaviour log-probs.
        batch = collate(episodes)
        values = torch.full(batch.rewards.shape, 0.5)
        deltas = aride.td_errors(batch.rewards, values, torch.zeros(len(episodes)), batch.done, batch.mask, 0.5)
        rhos = batch.mask.float()
        return trajectory_priorities(deltas, rhos, batch.behaviour_logp, batch.mask, w1=50.0, w2=1.0, w3=0.01)

    assert buf.refresh_next(score, len(buf), batch_size=5) == 12
    assert sorted(seen) == keys
    priorities = [buf.priority(k) for k in keys]
    assert len(set(priorities)) > 1 and all(p != 1.0 for p in priorities)
    best = keys[int(np.argmax(priorities))]
    counts = buf.sample(3000, beta=1.0).keys.count(best)
    assert counts / 3000 == pytest.approx(max(priorities) / sum(priorities), abs=0.03)


def test_refresh_next_rescores_the_buffer_round_robin_across_evictions() -> None:
    buf = ReplayBuffer(capacity=30, seed=0)
    keys = [buf.add(episode(2, f"e{i}")) for i in range(10)]
    seen: list[list[int]] = []

    def score(chunk: list[int], _episodes: list[EpisodeRecord]) -> list[float]:
        seen.append(chunk)
        return [2.0] * len(chunk)

    assert buf.refresh_next(score, 4, batch_size=3) == 4
    assert seen == [keys[0:3], keys[3:4]]
    seen.clear()
    buf.refresh_next(score, 4)
    assert seen == [keys[4:8]]
    # Eviction of the oldest while the cursor sits past them: the next ones are the rest, then the newest.
    newer = [buf.add(episode(2, f"n{i}")) for i in range(6)]  # 32 steps in 30 slots: e0 is gone
    seen.clear()
    buf.refresh_next(score, 5)
    assert seen == [[*keys[8:10], *newer[:3]]]
    seen.clear()
    buf.refresh_next(score, 6)  # wraps around to the oldest held
    assert seen == [[*newer[3:], keys[1], keys[2], keys[3]]]
    # The round robin survives a checkpoint.
    restored = ReplayBuffer.from_state_dict(buf.state_dict())
    seen.clear()
    restored.refresh_next(score, 1)
    assert seen == [[keys[4]]]


def test_uniform_sampling_among_a_subset_for_the_baselines() -> None:
    buf = ReplayBuffer(capacity=50, seed=0)
    keys = [buf.add(episode(2, f"e{i}")) for i in range(6)]
    sample = buf.sample_uniform(300, among=[keys[1], keys[4], 12345])
    assert set(sample.keys) == {keys[1], keys[4]} and torch.all(sample.is_weights == 1)
    with pytest.raises(ReplayBufferError):
        buf.sample_uniform(3, among=[12345])
    with pytest.raises(ReplayBufferError, match="empty"):
        ReplayBuffer(capacity=5).sample(1, beta=0.5)


def test_is_beta_anneals_linearly_then_holds() -> None:
    assert [is_beta(u, 0.4, 1.0, 100) for u in (0, 50, 100, 500)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    assert is_beta(3, 0.4, 1.0, 0) == 1.0


def test_sum_tree_finds_leaves_by_cumulative_mass_skipping_zeros() -> None:
    tree = SumTree(5)
    for i, v in enumerate([1.0, 0.0, 2.0, 0.0, 3.0]):
        tree.update(i, v)
    assert tree.total == 6.0
    found = tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 5.99]))
    assert found.tolist() == [0, 0, 2, 2, 4, 4]


# ---- batches and snapshots ---------------------------------------------------------------------------------------


def test_collate_builds_the_padded_layout_in_episode_major_order() -> None:
    eps = [episode(3, "a"), episode(2, "b", terminal=False)]
    b = collate(eps)
    assert b.mask.tolist() == [[True, True, True], [True, True, False]]
    assert b.rewards.tolist() == [[0, 0, 1], [0, 0, 0]]
    assert b.done.tolist() == [[False, False, True], [False, False, False]]
    assert b.invalid.tolist() == [[False, True, False], [False, True, False]]
    assert b.truncated.tolist() == [False, True] and b.success.tolist() == [True, False]
    assert b.lengths.tolist() == [3, 2]
    flat = torch.tensor([s.behaviour_logprob for e in eps for s in e.steps])
    assert torch.equal(aride.pad_steps(flat, b.mask), b.behaviour_logp)


def test_snapshot_restore_round_trip_through_json_is_exact() -> None:
    buf = ReplayBuffer(capacity=12, alpha=0.7, seed=5)
    keys = [buf.add(episode(n, f"e{i}", terminal=i % 2 == 0)) for i, n in enumerate([4, 3, 5, 2, 4])]
    buf.update_priorities(buf.keys(), np.linspace(0.5, 3.0, len(buf)))
    buf.sample(7, beta=0.5)  # advance the random state
    restored = ReplayBuffer.from_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert restored.keys() == buf.keys() and len(restored) == len(buf) and keys[-1] in restored
    for k in buf:
        assert restored.get(k) == buf.get(k)
        assert restored.slots(k) == buf.slots(k)
        assert restored.priority(k) == buf.priority(k)
    assert restored.num_steps == buf.num_steps and restored.episodes_evicted == buf.episodes_evicted
    a, b = buf.sample(20, beta=0.6), restored.sample(20, beta=0.6)
    assert a.keys == b.keys and torch.equal(a.is_weights, b.is_weights)
    assert buf.add(episode(5, "next")) == restored.add(episode(5, "next"))
    assert restored.keys() == buf.keys() and restored.state_dict() == buf.state_dict()


def test_corrupt_snapshot_is_refused_with_a_typed_error() -> None:
    buf = ReplayBuffer(capacity=8, seed=0)
    buf.add(episode(3))
    state = buf.state_dict()
    with pytest.raises(ReplayBufferError, match="format"):
        ReplayBuffer.from_state_dict({**state, "format": 99})
    overlapping = {**state, "episodes": state["episodes"] * 2}
    with pytest.raises(ReplayBufferError, match="overlaps"):
        ReplayBuffer.from_state_dict(overlapping)
    with pytest.raises(ReplayBufferError, match="malformed"):
        ReplayBuffer.from_state_dict({"format": 1})
