"""TrajectoryEvent → EpisodeRecord: field mapping, the done rule, free vs choice mode, unusable events (also for this
learner: another base model, choice-mode tokens that are none of the step's candidates)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from distrl_stream.errors import ActionConstraintError, TrajectoryError
from distrl_stream.events import Tensor, Termination, TrajectoryEvent
from distrl_stream.learner.records import EpisodeRecord, episode_from_event
from distrl_stream.policy.logprobs import ChoiceConstraint
from distrl_stream.testing.samples import png, sample_trajectory, with_screenshots
from tests.learner.simdata import sim_events


def event(steps: int = 3, *, termination: Termination = Termination.SUCCESS, mode: str = "choice") -> TrajectoryEvent:
    base = sample_trajectory(random.Random(steps), steps=steps, observation_chars=40)
    last = steps - 1
    fixed = [
        dataclasses.replace(s, done=t == last, reward=1.0 if t == last else 0.0, policy_version=t)
        for t, s in enumerate(base.steps)
    ]
    return dataclasses.replace(
        base, steps=fixed, termination=termination, success=termination is Termination.SUCCESS, mode=mode
    )


def test_conversion_keeps_what_the_learner_needs() -> None:
    ev = event(3)
    ep = episode_from_event(ev)
    assert (ep.episode_id, ep.task_id, ep.instruction, ep.success) == (ev.episode_id, ev.task_id, ev.instruction, True)
    assert (ep.mode, ep.collector_id, ep.task_template, ep.split) == (
        "choice",
        ev.collector_id,
        ev.task_template,
        "train",
    )
    assert len(ep) == 3
    for rec, src in zip(ep.steps, ev.steps, strict=True):
        assert rec.observation == src.observation
        assert rec.candidates == tuple(src.candidates)
        assert rec.action_text == src.action_text
        assert rec.behaviour_logprob == pytest.approx(src.behaviour_logprob)
        assert rec.token_ids == tuple(int(i) for i in src.token_ids.to_numpy())
        assert rec.token_logprobs == pytest.approx(tuple(src.token_logprobs.to_numpy()))
        assert rec.policy_version == src.policy_version
    assert [s.done for s in ep.steps] == [False, False, True]
    assert ep.terminal


def test_truncated_episode_ends_without_done_so_it_is_bootstrapped() -> None:
    ev = event(4, termination=Termination.TRUNCATED)
    assert ev.steps[-1].done  # the collector says the episode ended ...
    ep = episode_from_event(ev)
    assert not ep.steps[-1].done  # ... the learner treats its end as a cut, not a terminal state
    assert not ep.terminal


def test_free_mode_drops_candidates() -> None:
    ep = episode_from_event(event(2, mode="free"))
    assert all(s.candidates == () for s in ep.steps)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda ev: dataclasses.replace(ev, steps=[]), "no steps"),
        (lambda ev: _step0(ev, done=True), "done before the last step"),
        (lambda ev: _step0(ev, token_ids=Tensor.from_numpy(np.zeros(0, dtype=np.int32))), "token_ids"),
        (lambda ev: _step0(ev, token_ids=Tensor.from_numpy(np.ones(3, dtype=np.float32))), "token_ids"),
        (lambda ev: _step0(ev, token_ids=Tensor.from_numpy(np.array([-1], dtype=np.int32))), "negative token"),
        (lambda ev: _step0(ev, token_logprobs=Tensor.from_numpy(np.zeros(99, dtype=np.float32))), "99 token log-probs"),
        (lambda ev: _step0(ev, token_ids=Tensor(data=b"\x01\x02\x03", dtype="int32", shape=(5,))), "3 bytes"),
        (lambda ev: _step0(ev, token_logprobs=Tensor(data=b"", dtype="float128x", shape=(0,))), "token_logprobs"),
        (lambda ev: _step0(ev, reward=float("nan")), "non-finite"),
        (lambda ev: _step0(ev, behaviour_logprob=float("-inf")), "non-finite"),
        (lambda ev: _step0(ev, candidates=[]), "without candidates"),
        (lambda ev: _step0(ev, policy_version=-1), "negative policy version"),
        (lambda ev: dataclasses.replace(ev, mode="telepathy"), "unknown mode"),
        (lambda ev: _step0(ev, mode="telepathy"), "step 0 has unknown mode 'telepathy'"),
        (lambda ev: _step0(ev, candidates=[], mode="choice"), "step 0: choice mode without candidates"),
    ],
)
def test_unusable_events_raise_trajectory_error(breakage, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TrajectoryError, match=message):
        episode_from_event(breakage(event(3)))


def _step0(ev: TrajectoryEvent, **changes: object) -> TrajectoryEvent:
    return dataclasses.replace(ev, steps=[dataclasses.replace(ev.steps[0], **changes), *ev.steps[1:]])


def test_a_truncated_episode_keeps_its_final_observation_for_the_bootstrap() -> None:
    truncated = dataclasses.replace(event(3, termination=Termination.TRUNCATED), final_observation="[0] after")
    assert episode_from_event(truncated).final_observation == "[0] after"
    # A terminal episode has nothing after its end to bootstrap from, whatever the event carries.
    terminal = dataclasses.replace(event(3, termination=Termination.FAILURE), final_observation="[0] after")
    assert episode_from_event(terminal).final_observation is None
    # A v1 record (no final observation) is still usable: the learner bootstraps it with 0.
    assert episode_from_event(event(3, termination=Termination.TRUNCATED)).final_observation is None


def test_an_episode_of_another_base_model_is_refused_naming_both() -> None:
    ev = dataclasses.replace(event(2), base_model="other-base")
    with pytest.raises(TrajectoryError, match="base model 'other-base', not by this learner's 'tiny'"):
        episode_from_event(ev, base_model="tiny")
    assert episode_from_event(ev, base_model="other-base").episode_id == ev.episode_id


def test_an_episode_of_another_model_in_a_folder_of_the_same_name_is_refused_by_its_fingerprint() -> None:
    ours, theirs = "a" * 64, "b" * 64
    ev = dataclasses.replace(event(2), base_model="tiny", base_fingerprint=theirs)
    refused = r"fingerprint b{16}…, not by this learner.s \(fingerprint a{16}…\): another model in a folder"
    with pytest.raises(TrajectoryError, match=refused):
        episode_from_event(ev, base_model="tiny", base_fingerprint=ours)
    assert len(episode_from_event(ev, base_model="tiny", base_fingerprint=theirs)) == len(ev.steps)
    # Unknown on either side (a local model, a record before v4): the name is all there is to compare.
    assert len(episode_from_event(dataclasses.replace(ev, base_fingerprint=""), base_fingerprint=ours)) == 2
    assert len(episode_from_event(ev, base_model="tiny")) == 2


def test_choice_tokens_are_checked_step_by_step_and_free_mode_is_not() -> None:
    checked: list[tuple[tuple[str, ...], tuple[int, ...]]] = []

    def check(candidates: Sequence[str], token_ids: Sequence[int]) -> None:
        checked.append((tuple(candidates), tuple(token_ids)))
        if len(checked) == 2:
            raise ActionConstraintError("token 7 at position 0 is not allowed")

    with pytest.raises(TrajectoryError, match=r"step 1: token 7 .* not one of its candidates"):
        episode_from_event(event(3), check_action=check)
    ev = event(3)
    checked.clear()
    episode_from_event(dataclasses.replace(ev, mode="free"), check_action=check)
    assert checked == []


def test_a_free_step_of_a_choice_episode_is_kept_and_recomputed_in_free_mode() -> None:
    """A choice-mode screen without candidates is asked in free mode (collector/episode.py); its step says so."""
    ev = _step0(event(3), candidates=[], mode="free")
    checked: list[tuple[str, ...]] = []
    ep = episode_from_event(ev, check_action=lambda candidates, _ids: checked.append(tuple(candidates)))
    assert [s.mode for s in ep.steps] == ["free", "choice", "choice"]
    assert ep.steps[0].choices is None and ep.steps[1].choices == ev.steps[1].candidates
    assert checked == [tuple(s.candidates) for s in ev.steps[1:]]  # the free step is not checked as a choice
    # A free step keeps no candidates, whatever it carries; steps written before TrajectoryEvent v4 (mode None)
    # take the episode's mode.
    assert episode_from_event(_step0(event(3), mode="free")).steps[0].candidates == ()
    assert [s.mode for s in episode_from_event(event(2, mode="free")).steps] == ["free", "free"]
    # A checkpoint written before steps had a mode restores them in their episode's.
    saved = episode_from_event(event(2, mode="free")).to_dict()
    for step in saved["steps"]:
        del step["mode"]
    assert [s.mode for s in EpisodeRecord.from_dict(saved).steps] == ["free", "free"]


def test_the_learners_choice_constraint_accepts_collected_tokens_and_refuses_others(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    constraint = ChoiceConstraint(tokenizer, len(tokenizer))
    [ev] = sim_events(tokenizer, 1, seed=4)
    assert len(episode_from_event(ev, base_model="tiny", check_action=constraint.allowed)) == len(ev.steps)
    # A well-formed action that is none of the step's candidates, with its stop token.
    assert '{"action_type":"click","index":99}' not in ev.steps[0].candidates
    other = [*tokenizer('{"action_type":"click","index":99}')["input_ids"], tokenizer.eos_token_id]
    forged = _step0(
        ev,
        token_ids=Tensor.from_numpy(np.array(other, dtype=np.int32)),
        token_logprobs=Tensor.from_numpy(np.full(len(other), -0.5, dtype=np.float32)),
    )
    with pytest.raises(TrajectoryError, match=r"step 0: token \d+ at position \d+ is not allowed"):
        episode_from_event(forged, check_action=constraint.allowed)


def test_a_vision_learner_refuses_steps_whose_screenshot_is_missing_or_altered(tmp_path: Path) -> None:
    event = sample_trajectory(random.Random(8), steps=3, observation_chars=40, candidates=2)
    shots = [png((32, 32), (i * 60, 0, 0)) for i in range(3)]
    good = with_screenshots(event, shots, tmp_path / "shots")
    episode = episode_from_event(good, screenshots=True)
    assert [s.screenshot_sha256 for s in episode.steps] == [hashlib.sha256(b).hexdigest() for b in shots]
    # A text learner neither needs nor reads them.
    assert episode_from_event(event).steps[0].screenshot_uri is None

    altered = tmp_path / "altered.png"
    altered.write_bytes(shots[1] + b"x")
    steps = list(good.steps)
    steps[1] = dataclasses.replace(steps[1], screenshot_uri=altered.as_uri())
    with pytest.raises(TrajectoryError, match=r"step 1: screenshot file://\S+altered.png altered: sha256"):
        episode_from_event(dataclasses.replace(good, steps=steps), screenshots=True)
    steps[1] = dataclasses.replace(steps[1], screenshot_uri=(tmp_path / "gone.png").as_uri())
    with pytest.raises(TrajectoryError, match=r"step 1: screenshot file://\S+gone.png unreadable"):
        episode_from_event(dataclasses.replace(good, steps=steps), screenshots=True)
    with pytest.raises(TrajectoryError, match="step 0: no screenshot for a policy that reads them"):
        episode_from_event(event, screenshots=True)


def test_token_ids_outside_the_policys_vocabulary_are_refused_at_ingest() -> None:
    """A poison pill: an id past the vocabulary would fail every forward pass on it, at every restart."""
    good = _step0(event(3), prompt_token_ids=Tensor.from_token_ids([1, 2, 3]))
    assert episode_from_event(good, vocab_size=1 << 16).steps[0].prompt_token_ids == (1, 2, 3)
    past_action = _step0(event(3), token_ids=Tensor.from_numpy(np.array([5, 1 << 16], dtype=np.int32)))
    with pytest.raises(TrajectoryError, match=r"token_ids: token id 65536 outside the policy.s vocabulary of 65536"):
        episode_from_event(past_action, vocab_size=1 << 16)
    past_prompt = _step0(event(3), prompt_token_ids=Tensor.from_token_ids([1, 70000]))
    with pytest.raises(TrajectoryError, match=r"prompt_token_ids: token id 70000 outside"):
        episode_from_event(past_prompt, vocab_size=1 << 16)
    for bad in (Tensor.from_numpy(np.zeros(0, dtype=np.uint16)), Tensor.from_numpy(np.ones((2, 2), dtype=np.int32))):
        with pytest.raises(TrajectoryError, match="prompt_token_ids must be a non-empty 1-D integer array"):
            episode_from_event(_step0(event(3), prompt_token_ids=bad))
