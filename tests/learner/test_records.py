"""TrajectoryEvent → EpisodeRecord: field mapping, the done rule, free vs choice mode, unusable events."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from distrl_stream.errors import TrajectoryError
from distrl_stream.events import Tensor, Termination, TrajectoryEvent
from distrl_stream.learner.records import episode_from_event
from distrl_stream.testing.samples import sample_trajectory


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
