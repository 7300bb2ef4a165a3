"""Pacing (distrl_stream.pacing): the combinations `check` refuses stall, and every configuration it accepts makes
progress whatever the episodes turn out to be (lost, dead-lettered, incomplete, never a success).

The property tests run the pacing functions the roles call in a model of one run: collectors insert records while
the rate limit allows, the learner reads every record, keeps the usable ones in a FIFO buffer and updates while its
rules allow, publishing a version every `updates_per_version` updates. Deadlock is a tick at which neither side can
act; the model asserts there is none.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distrl_stream import pacing
from distrl_stream.config import CollectorConfig, LearnerConfig, load_config
from distrl_stream.errors import ConfigError


@dataclass(frozen=True)
class Outcome:
    """What one attempted episode became."""

    published: bool  # on the topic (async collectors never publish an episode that failed before its first step)
    usable: bool  # admitted by the learner (not dead-lettered, stale or incomplete)
    success: bool


@dataclass
class Run:
    """The model's state, for the failure message."""

    tick: int = 0
    on_topic: int = 0
    read: int = 0
    updates: int = 0
    published_step: int = 0


def simulate(
    collector: CollectorConfig,
    learner: LearnerConfig,
    outcomes: list[Outcome],
    buffer_episodes: int,
    ticks: int,
) -> Run:
    """Run the model for ``ticks`` ticks (one attempt and one update at most per tick); fail on a deadlock."""
    run = Run()
    buffer: deque[bool] = deque(maxlen=buffer_episodes)  # the usable episodes' success flags, oldest first
    limited = pacing.rate_limited(collector, learner)
    assert collector.samples_per_insert is not None or not limited
    for run.tick in range(ticks):
        acted = False
        budget = (
            pacing.insert_budget(
                run.published_step,
                batch_episodes=learner.batch_episodes,
                samples_per_insert=collector.samples_per_insert,  # type: ignore[arg-type]
                min_buffer_episodes=learner.min_buffer_episodes,
                updates_per_version=learner.updates_per_version,
            )
            if limited
            else math.inf
        )
        if pacing.may_insert(run.on_topic, 0, budget):
            outcome = outcomes[run.tick % len(outcomes)]
            acted = True
            if outcome.published:
                run.on_topic += 1
                run.read += 1  # the learner reads what arrives within the tick
                if outcome.usable:
                    buffer.append(outcome.success)
        can_learn = learner.algorithm != "filtered_bc" or any(buffer)
        if (
            len(buffer) >= learner.min_buffer_episodes
            and can_learn
            and pacing.may_update(
                run.updates,
                run.read,
                batch_episodes=learner.batch_episodes,
                max_replay_ratio=learner.max_replay_ratio,
            )
        ):
            run.updates += 1
            if run.updates % learner.updates_per_version == 0:
                run.published_step = run.updates
            acted = True
        assert acted, f"deadlock: {run} (buffer {len(buffer)} episodes, {sum(buffer)} successes)"
    return run


outcome = st.builds(Outcome, published=st.booleans(), usable=st.booleans(), success=st.booleans())
# Mostly usable streams, as real runs are, with every kind of loss mixed in.
outcomes = st.lists(outcome, min_size=1, max_size=12)


@st.composite
def configurations(draw: st.DrawFn) -> tuple[CollectorConfig, LearnerConfig]:
    spi = draw(st.one_of(st.none(), st.floats(0.25, 8.0)))
    learner = LearnerConfig(
        algorithm=draw(st.sampled_from(["aride", "digirl", "filtered_bc"])),
        batch_episodes=draw(st.integers(1, 16)),
        min_buffer_episodes=draw(st.integers(1, 16)),
        updates_per_version=draw(st.integers(1, 20)),
        max_replay_ratio=draw(st.one_of(st.just(0.0), st.floats(0.25, 16.0))),
    )
    collector = CollectorConfig(samples_per_insert=spi, mode="async")
    return collector, learner


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(configurations(), outcomes, st.integers(1, 64))
def test_every_accepted_configuration_makes_progress_whatever_the_episodes(
    config: tuple[CollectorConfig, LearnerConfig], stream: list[Outcome], buffer_episodes: int
) -> None:
    collector, learner = config
    try:
        pacing.check(collector, learner)
    except ValueError:
        assume(False)
    run = simulate(collector, learner, stream, buffer_episodes, ticks=400)
    # Nothing stalls, and where the data allows learning the learner does learn.
    kept = [o for o in stream if o.published and o.usable]
    learnable = any(o.success for o in kept) if learner.algorithm == "filtered_bc" else bool(kept)
    # (Where the replay cap allowed a first update on what was read: a low cap over a sparse stream may need more
    # records than the model's ticks produce, which is slow, not stalled.)
    capped = not pacing.may_update(
        0, run.read, batch_episodes=learner.batch_episodes, max_replay_ratio=learner.max_replay_ratio
    )
    if learnable and buffer_episodes >= learner.min_buffer_episodes and not capped:
        assert run.updates > 0


def test_the_rate_limit_under_filtered_bc_would_stall_and_is_refused() -> None:
    collector = CollectorConfig(samples_per_insert=2.0)
    learner = LearnerConfig(algorithm="filtered_bc", batch_episodes=8, min_buffer_episodes=8, updates_per_version=5)
    assert not pacing.rate_limited(collector, learner)
    # Were it applied: after a version cut on a success, a run of failures fills the budget with nothing to imitate
    # once the success has left the buffer, and both sides wait.
    stream = [Outcome(True, True, True), *[Outcome(True, True, False)] * 500]  # one success, then none
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pacing, "rate_limited", lambda _c, _l: True)
        with pytest.raises(AssertionError, match="deadlock"):
            simulate(collector, learner, stream, buffer_episodes=16, ticks=400)
    with pytest.raises(ConfigError, match=r"collector\.samples_per_insert .* learner\.algorithm = 'filtered_bc'"):
        load_config(None, collector={"samples_per_insert": 2.0}, learner={"algorithm": "filtered_bc"})


def test_a_replay_cap_below_the_insert_ratio_stalls_and_is_refused() -> None:
    collector = CollectorConfig(samples_per_insert=2.0)
    learner = LearnerConfig(batch_episodes=2, min_buffer_episodes=2, updates_per_version=1, max_replay_ratio=1.0)
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(collector, learner, [Outcome(True, True, True)], buffer_episodes=100, ticks=400)
    with pytest.raises(ConfigError, match=r"learner\.max_replay_ratio \(1\.0\) below collector\.samples_per_insert"):
        load_config(None, collector={"samples_per_insert": 2.0}, learner={"max_replay_ratio": 1.0})
    # At the ratio itself it runs.
    simulate(collector, learner.model_copy(update={"max_replay_ratio": 2.0}), [Outcome(True, True, True)], 100, 400)


def test_sync_rounds_with_dropped_episodes_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"collector\.on_error = 'drop' with collector\.mode = 'sync'"):
        load_config(None, collector={"mode": "sync", "on_error": "drop"})
    load_config(None, collector={"mode": "sync"})  # publish: every attempt reaches the learner's round


def test_a_limit_from_the_start_stalls_on_lost_episodes() -> None:
    # The old rule: the slack binds before any update, and lost episodes leave the buffer short of its minimum.
    collector = CollectorConfig(samples_per_insert=2.0)
    learner = LearnerConfig(batch_episodes=8, min_buffer_episodes=8, updates_per_version=5)
    stream = [*[Outcome(True, False, False)] * 3, Outcome(True, True, True)]  # three in four dead-lettered
    now = pacing.insert_budget

    def from_the_start(step: int, **kw: float) -> float:
        return (
            kw["min_buffer_episodes"] + kw["updates_per_version"] * kw["batch_episodes"] / kw["samples_per_insert"]
            if step <= 0
            else now(step, **kw)
        )  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pacing, "insert_budget", from_the_start)
        with pytest.raises(AssertionError, match="deadlock"):
            simulate(collector, learner, stream, buffer_episodes=100, ticks=400)
    simulate(collector, learner, stream, buffer_episodes=100, ticks=400)  # the rule as it is


def test_the_rate_limit_starts_with_the_first_update() -> None:
    # Before it, the learner fills its buffer: a collector that paused at the slack would wait on lost episodes.
    kwargs = {"batch_episodes": 8, "samples_per_insert": 2.0, "min_buffer_episodes": 8, "updates_per_version": 5}
    assert pacing.insert_budget(0, **kwargs) == math.inf
    assert pacing.insert_budget(5, **kwargs) == 5 * 8 / 2 + 8 + 5 * 8 / 2
    assert pacing.may_insert(59, 0, 60.0) and not pacing.may_insert(59, 1, 60.0)


def test_round_complete_counts_attempts() -> None:
    assert not pacing.round_complete(3, 4)
    assert pacing.round_complete(4, 4)
