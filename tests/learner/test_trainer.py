"""The trainer on the tiny model (no services): each algorithm's update, critic warm-up, bad episodes, feature cache."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from distrl_stream.config import LearnerConfig, ModelConfig
from distrl_stream.envs.sim import sim_tasks
from distrl_stream.errors import LearnerError
from distrl_stream.events import TrajectoryEvent, decode
from distrl_stream.learner import aride
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.records import EpisodeRecord, collate, episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from distrl_stream.policy.precision import Precision, resolve_precision
from distrl_stream.policy.prompt import Prompter, build_prompt
from tests.fixtures.packing import count_packed_passes
from tests.learner.simdata import sim_event, sim_events

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def episodes(tiny_model_dir: Path) -> list[EpisodeRecord]:
    _model, tokenizer = load_policy(tiny_model_dir, ModelConfig())
    events = sim_events(tokenizer, 24, seed=3)
    return [episode_from_event(e) for e in events]


def trainer(
    tiny_model_dir: Path, episodes: list[EpisodeRecord], precision: Precision = "float32", **settings: object
) -> Trainer:
    model, tokenizer = load_policy(tiny_model_dir, ModelConfig(), precision=precision)
    cfg = LearnerConfig(**{"batch_episodes": 4, "min_buffer_episodes": 4, "policy_lr": 1e-2, **settings})
    out = Trainer(cfg, model, tokenizer, ReplayBuffer.from_config(cfg), precision=precision)
    for episode in episodes:
        out.buffer.add(episode)
    return out


def lora_snapshot(t: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.policy_params]


def changed(before: list[torch.Tensor], t: Trainer) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, t.policy_params, strict=True))


@pytest.mark.parametrize("algorithm", ["aride", "digirl", "filtered_bc", "bc"])
def test_each_algorithm_updates_the_policy(tiny_model_dir: Path, episodes: list[EpisodeRecord], algorithm: str) -> None:
    assert any(e.success for e in episodes)  # filtered BC needs one
    t = trainer(tiny_model_dir, episodes)
    before = lora_snapshot(t)
    stats = t.update(algorithm, version=0)  # type: ignore[arg-type]
    assert stats is not None and all(isinstance(v, float) for v in stats.values())
    assert changed(before, t)
    assert t.updates == 1


def test_each_aride_update_rescores_the_next_share_of_the_buffer(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    # 24 episodes, K = 5: 4.8 owed after each update, the fraction carried over; all of them within 5 updates.
    t = trainer(tiny_model_dir, episodes, priority_refresh_interval=5)
    rescored: list[int] = []
    refresh_next = t.buffer.refresh_next

    def counted(score: Any, count: int, batch_size: int = 32) -> int:
        before = t.buffer.update_priorities
        t.buffer.update_priorities = lambda keys, p: rescored.extend(keys) or before(keys, p)  # type: ignore[method-assign]
        try:
            return refresh_next(score, count, batch_size)
        finally:
            t.buffer.update_priorities = before  # type: ignore[method-assign]

    t.buffer.refresh_next = counted  # type: ignore[method-assign]
    refreshed = [t.update(version=0)["priorities_refreshed"] for _ in range(5)]  # type: ignore[index]
    assert refreshed == [4.0, 5.0, 5.0, 5.0, 5.0]
    assert sorted(rescored) == sorted(t.buffer.keys())  # each held episode once, none twice
    # A very large K refreshes practically never (the fraction only accumulates).
    rare = trainer(tiny_model_dir, episodes, priority_refresh_interval=10**9)
    assert rare.update(version=0)["priorities_refreshed"] == 0.0  # type: ignore[index]


def test_filtered_bc_waits_for_a_success(tiny_model_dir: Path, episodes: list[EpisodeRecord]) -> None:
    t = trainer(tiny_model_dir, [e for e in episodes if not e.success], algorithm="filtered_bc")
    assert t.update(version=0) is None
    assert t.updates == 0


def test_critic_warmup_leaves_the_policy_alone(tiny_model_dir: Path, episodes: list[EpisodeRecord]) -> None:
    t = trainer(tiny_model_dir, episodes, critic_warmup_updates=2)
    policy, critic = lora_snapshot(t), [p.detach().clone() for p in t.step_critic.parameters()]
    for _ in range(2):
        assert t.update(version=0) is not None
    assert not changed(policy, t)
    assert any(not torch.equal(a, b) for a, b in zip(critic, t.step_critic.parameters(), strict=True))
    t.update(version=0)
    assert changed(policy, t)


def test_an_action_impossible_under_its_candidates_is_removed_not_fatal(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    bad = episodes[0]
    forged = dataclasses.replace(
        bad,
        episode_id="forged",
        steps=(dataclasses.replace(bad.steps[0], token_ids=(5, 5, 5, 5)), *bad.steps[1:]),
    )
    t = trainer(tiny_model_dir, [forged], batch_episodes=2, min_buffer_episodes=1)
    assert t.update(version=0) is None
    assert t.rejected == 1 and len(t.buffer) == 0


def test_an_impossible_action_met_by_the_priority_refresh_is_removed_not_fatal(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    good = episodes[1:4]
    forged = dataclasses.replace(
        episodes[0],
        episode_id="forged",
        steps=(*episodes[0].steps[:-1], dataclasses.replace(episodes[0].steps[-1], token_ids=(5, 5, 5, 5))),
    )
    t = trainer(tiny_model_dir, [good[0], forged, *good[1:]])
    # Whatever an update samples, the full refresh scores every held episode, the forged one included.
    assert t.refresh_priorities(len(t.buffer)) == len(good)
    assert t.rejected == 1
    assert [e.episode_id for _k, e in t.buffer.items()] == [e.episode_id for e in good]


def test_critic_features_are_computed_once_per_prompt(tiny_model_dir: Path, episodes: list[EpisodeRecord]) -> None:
    t = trainer(tiny_model_dir, episodes[:4])
    prompts = [t.step_prompt(e, i) for e in episodes[:4] for i in range(len(e))]
    first = t.features(prompts)
    misses = t.features.misses
    again = t.features(prompts)
    assert t.features.misses == misses == len(set(prompts))
    assert torch.equal(first, again)


def test_a_truncated_episode_bootstraps_v_of_its_final_observation_and_a_v1_one_zero(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    t = trainer(tiny_model_dir, episodes)
    base = max(episodes, key=len)
    steps = (*base.steps[:-1], dataclasses.replace(base.steps[-1], done=False, reward=0.0))
    cut = dataclasses.replace(base, steps=steps, termination="truncated", success=False, final_observation="[0] x")
    v1 = dataclasses.replace(cut, final_observation=None)  # the same episode, from an event without the field
    batch = collate([cut, v1])
    _logits, values, bootstrap = t.critic_values([cut, v1], batch.mask)
    final_prompt = build_prompt(cut.instruction, "[0] x", cut.previous_actions(len(cut)))
    with torch.no_grad():
        v_final = float(t.step_critic.value(t.features([final_prompt]))[0])
    assert bootstrap.tolist() == pytest.approx([v_final, 0.0])
    assert v_final > 0.0

    cfg = t.cfg
    ones = torch.ones_like(batch.rewards)
    ret = aride.retrace_targets(
        batch.rewards, values, bootstrap, batch.done, ones, batch.mask, cfg.gamma, cfg.retrace_lambda, cfg.c_bar
    )
    n = len(cut)
    discounted = torch.tensor([cfg.gamma ** (n - k) * v_final for k in range(n)])
    # On-policy traces are 1: the targets differ from the zero bootstrap's by exactly γ^{L−t} V(s_L).
    assert (ret[0, :n] - ret[1, :n]).tolist() == pytest.approx(discounted.tolist(), abs=1e-6)


def _first_update_gradients(t: Trainer, algorithm: str) -> list[torch.Tensor]:
    """The policy gradient of one update, as it reaches the optimiser."""
    seen: list[list[torch.Tensor]] = []
    apply = t._apply

    def record(*, policy: bool) -> dict[str, float]:
        seen.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in t.policy_params])
        return apply(policy=policy)

    t._apply = record  # type: ignore[method-assign]
    assert t.update(algorithm, version=0) is not None  # type: ignore[arg-type]
    return seen[0]


@pytest.mark.parametrize("algorithm", ["aride", "digirl", "bc"])
def test_micro_batches_give_the_whole_batch_gradient(
    tiny_model_dir: Path, episodes: list[EpisodeRecord], algorithm: str
) -> None:
    torch.manual_seed(0)  # a fresh adapter's LoRA A is drawn from torch's generator
    whole = trainer(tiny_model_dir, episodes, micro_batch_steps=10_000)
    torch.manual_seed(0)
    micro = trainer(tiny_model_dir, episodes, micro_batch_steps=3)
    expected = _first_update_gradients(whole, algorithm)
    got = _first_update_gradients(micro, algorithm)
    assert any(g.abs().sum() > 0 for g in expected)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir: Path, episodes: list[EpisodeRecord]) -> None:
    torch.manual_seed(0)
    plain = _first_update_gradients(trainer(tiny_model_dir, episodes), "aride")
    torch.manual_seed(0)
    checkpointed = trainer(tiny_model_dir, episodes, gradient_checkpointing=True)
    # Checkpointing shows as work: every decoder layer starts again in the backward pass (a pre-hook: torch stops
    # the recomputation early, once the tensors the backward needs exist).
    calls: list[bool] = []
    layer = checkpointed.model.get_base_model().get_decoder().layers[0]
    handle = layer.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    try:
        got = _first_update_gradients(checkpointed, "aride")
    finally:
        handle.remove()
    forwards_with_grad = calls.count(True)
    torch.manual_seed(0)
    again = trainer(tiny_model_dir, episodes)
    plain_calls: list[bool] = []
    handle = (
        again.model.get_base_model()
        .get_decoder()
        .layers[0]
        .register_forward_pre_hook(lambda *_: plain_calls.append(torch.is_grad_enabled()))
    )
    try:
        _first_update_gradients(again, "aride")
    finally:
        handle.remove()
    assert forwards_with_grad > plain_calls.count(True)
    for a, b in zip(plain, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_a_loaded_adapter_s_versions_name_the_base_they_are_trained_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    fresh, _ = load_policy(tiny_model_dir, ModelConfig())
    fresh.save_pretrained(tmp_path / "warm")
    config = json.loads((tmp_path / "warm" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "/elsewhere/tiny"  # made on another run's copy of the model
    (tmp_path / "warm" / "adapter_config.json").write_text(json.dumps(config))
    policy, _ = load_policy(tiny_model_dir, ModelConfig(), tmp_path / "warm")
    policy.save_pretrained(tmp_path / "v2")
    saved = json.loads((tmp_path / "v2" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(tiny_model_dir)


def test_gradient_checkpointing_with_dropout_is_refused(tiny_model_dir: Path) -> None:
    model, tokenizer = load_policy(tiny_model_dir, ModelConfig(lora_dropout=0.1))
    cfg = LearnerConfig(gradient_checkpointing=True)
    with pytest.raises(LearnerError, match=r"needs a policy without dropout: model\.lora_dropout 0\.1"):
        Trainer(cfg, model, tokenizer, ReplayBuffer.from_config(cfg))


def test_an_aride_update_on_a_real_pretrained_model(smollm2_dir: Path) -> None:
    # SmolLM2-135M with chat prompts, micro-batches of 2 steps and checkpointed layers, at the precision `auto` picks
    # on this CPU (up's pretrained profile: bf16 with bf16 units, float32 without, where bf16 is emulated and slow).
    precision = resolve_precision("auto", "cpu", role="learner")
    model, tokenizer = load_policy(smollm2_dir, ModelConfig(), precision=precision)
    rng = random.Random(0)
    tasks = sim_tasks("train", 20, ["take_photo", "turn_on_setting"])
    prompter = Prompter(tokenizer)
    episodes = [episode_from_event(sim_event(tokenizer, rng.choice(tasks), rng, prompter=prompter)) for _ in range(4)]
    cfg = LearnerConfig(
        batch_episodes=2, min_buffer_episodes=2, micro_batch_steps=2, gradient_checkpointing=True, policy_lr=1e-3
    )
    t = Trainer(cfg, model, tokenizer, ReplayBuffer.from_config(cfg), precision=precision)
    for episode in episodes:
        t.buffer.add(episode)
    assert t.prompter.format == "chat" and sum(len(e) for e in episodes) > cfg.micro_batch_steps
    before = lora_snapshot(t)
    stats = t.update("aride", version=0)
    assert stats is not None and all(math.isfinite(v) for v in stats.values())
    assert changed(before, t)
    assert stats["rho_mean"] > 0
    # Master weights and optimiser state are float32, under bf16 autocast too.
    assert {p.dtype for p in t.policy_params} == {torch.float32}
    assert {v.dtype for state in t.policy_opt.state.values() for v in state.values() if v.dim()} == {torch.float32}


def test_events_written_before_prompt_ids_existed_still_train(tiny_model_dir: Path) -> None:
    """The committed sample of TrajectoryEvent v2 records: their prompts are rendered again, as before."""
    sample = json.loads((Path(__file__).parent / "data" / "trajectories_v2.json").read_text())
    old = [episode_from_event(decode(base64.b64decode(b), expect=TrajectoryEvent)) for b in sample["events"]]
    t = trainer(tiny_model_dir, old)
    assert all(step.prompt_token_ids is None for e in old for step in e.steps)
    assert isinstance(t.step_prompt(old[0], 0), str) and t.check_prompt_ids(old[0]) == 0
    before = lora_snapshot(t)
    stats = t.update("aride", version=0)
    assert stats is not None and changed(before, t)


class _OtherTemplate(Prompter):
    """A learner whose own rendering differs from what the collector sent (another template or prompt version)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return "Learner side. " + super().__call__(*args, **kwargs)


def test_the_update_uses_the_servers_prompt_ids_not_the_learners_rendering(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    batch = episodes[:4]
    assert all(step.prompt_token_ids for e in batch for step in e.steps)
    same, other = trainer(tiny_model_dir, batch), trainer(tiny_model_dir, batch)
    other.prompter = _OtherTemplate()
    steps = sum(len(e) for e in batch)
    assert sum(other.check_prompt_ids(e) for e in batch) == steps == other.prompt_ids_mismatched
    assert sum(same.check_prompt_ids(e) for e in batch) == 0 and same.prompt_ids_checked == steps
    assert [other.step_prompt(e, t).ids for e in batch for t in range(len(e))] == [  # type: ignore[union-attr]
        e.steps[t].prompt_token_ids for e in batch for t in range(len(e))
    ]
    mask = collate(batch).mask
    with torch.no_grad():
        ours, theirs = same.policy_terms(batch, mask)[0], other.policy_terms(batch, mask)[0]
    assert torch.equal(ours, theirs)
    # What the other rendering would have trained on differs.
    rendered = [
        dataclasses.replace(e, steps=tuple(dataclasses.replace(s, prompt_token_ids=None) for s in e.steps))
        for e in batch
    ]
    with torch.no_grad():
        assert not torch.allclose(other.policy_terms(rendered, mask)[0], theirs)


def test_the_mismatch_is_measured_on_the_current_versions_steps_with_the_policy_steps_since(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    t = trainer(tiny_model_dir, episodes, critic_warmup_updates=2)
    assert "logp_mismatch_mean" not in (t.update("aride", version=0) or {})  # the weights of no version known
    t.mark_version(0)  # a fresh adapter: the base model, served as version 0
    first = t.update("aride", version=0)  # the critic's warm-up: the policy does not move
    second = t.update("aride", version=0)  # computed before its own step
    third = t.update("aride", version=0)  # one policy step since version 0
    assert first is not None and second is not None and third is not None
    assert first["logp_mismatch_steps"] > 0 and 0 <= first["logp_mismatch_mean"] <= first["logp_mismatch_max"]
    assert (first["logp_mismatch_updates_ahead"], second["logp_mismatch_updates_ahead"]) == (0, 0)
    assert third["logp_mismatch_updates_ahead"] == 1
    t.mark_version(1)
    fourth = t.update("aride", version=1)
    assert fourth is not None and "logp_mismatch_mean" not in fourth  # no step of the batch was acted by version 1


def test_bf16_autocast_keeps_log_pi_near_float32_and_master_weights_in_float32(
    tiny_model_dir: Path, episodes: list[EpisodeRecord]
) -> None:
    full, half = trainer(tiny_model_dir, episodes[:4]), trainer(tiny_model_dir, episodes[:4], "bfloat16")
    mask = collate(episodes[:4]).mask
    with torch.no_grad():
        gap = (full.policy_terms(episodes[:4], mask)[0] - half.policy_terms(episodes[:4], mask)[0]).abs()
    assert 0 < float(gap.max()) < 0.1  # bf16 arithmetic ran, and stayed close
    stats = half.update("aride", version=0)
    assert stats is not None and all(math.isfinite(v) for v in stats.values())
    assert {p.dtype for p in half.policy_params} == {torch.float32}


@pytest.mark.parametrize("shared_prefix", [False, True], ids=["length_sorted", "packed"])
def test_micro_batches_give_each_step_its_own_log_pi_in_episode_order(
    tiny_model_dir: Path, episodes: list[EpisodeRecord], shared_prefix: bool
) -> None:
    batch = episodes[:6]
    t = trainer(tiny_model_dir, batch, micro_batch_steps=4, shared_prefix=shared_prefix)
    with torch.no_grad():
        logp = t.policy_terms(batch, collate(batch).mask)[0]
        one_by_one = [float(t._step_terms([(e, s)])[0][0]) for e in batch for s in range(len(e))]
    lengths = [len(e) for e in batch]
    prompts = [len(e.steps[s].prompt_token_ids or ()) for e in batch for s in range(len(e))]
    assert prompts != sorted(prompts)  # sorting by length reorders the steps
    expected = torch.tensor([0.0]).new_zeros(logp.shape)
    flat = iter(one_by_one)
    for row, n in enumerate(lengths):
        for step in range(n):
            expected[row, step] = next(flat)
    assert torch.allclose(logp, expected, atol=1e-5)


@pytest.mark.parametrize(
    "settings",
    [{}, {"micro_batch_steps": 3}, {"gradient_checkpointing": True}],
    ids=["one_pass", "micro_batches", "checkpointing"],
)
def test_packed_passes_give_the_unpacked_log_pi_and_gradient(
    tiny_model_dir: Path, episodes: list[EpisodeRecord], settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    unpacked = trainer(tiny_model_dir, episodes, shared_prefix=False, **settings)
    torch.manual_seed(0)
    packed = trainer(tiny_model_dir, episodes, **settings)
    assert packed.shared_prefix and not unpacked.shared_prefix
    passes = count_packed_passes(monkeypatch)
    batch = episodes[:4]
    with torch.no_grad():
        expected_logp, expected_entropy = unpacked.policy_terms(batch, collate(batch).mask)
        assert not passes
        logp, entropy = packed.policy_terms(batch, collate(batch).mask)
        assert passes
    torch.testing.assert_close(logp, expected_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=0)
    expected = _first_update_gradients(unpacked, "aride")
    got = _first_update_gradients(packed, "aride")
    assert any(g.abs().sum() > 0 for g in expected)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_a_policy_without_sdpa_attention_takes_the_unpacked_pass(
    tiny_model_dir: Path, episodes: list[EpisodeRecord], caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = load_policy(tiny_model_dir, ModelConfig())
    model.get_base_model().set_attn_implementation("eager")
    cfg = LearnerConfig(batch_episodes=4, min_buffer_episodes=4)
    with caplog.at_level("INFO", logger="distrl_stream.learner.trainer"):
        t = Trainer(cfg, model, tokenizer, ReplayBuffer.from_config(cfg))
    assert not t.shared_prefix
    assert "shared_prefix is off, every step's prompt is computed whole: the policy's attention is eager" in caplog.text
    for episode in episodes:
        t.buffer.add(episode)
    assert t.update("aride", version=0) is not None
