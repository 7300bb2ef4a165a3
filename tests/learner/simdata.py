"""Trajectory events of the simulated phone for learner tests: random play in choice mode, real token ids.

Episodes are played by the collector's own loop (``run_episode``) with a uniformly random
:class:`~distrl_stream.testing.scripted.ScriptedPolicy` (noise 1): the actions are tokenised as the tiny model's
tokenizer spells them (plus the end-of-text stop token), so the learner can recompute log π on them under the choice
constraint; the behaviour log-prob is that of a uniform choice among the candidates (what matters here is the
plumbing, not the policy).
"""

from __future__ import annotations

import asyncio
import random
import uuid

from transformers import PreTrainedTokenizerBase

from distrl_stream.collector import run_episode
from distrl_stream.envs.base import Task
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.events import TrajectoryEvent
from distrl_stream.events.screenshots import ScreenshotStore
from distrl_stream.policy.prompt import Prompter
from distrl_stream.testing.scripted import ScriptedPolicy

TEMPLATES = ("take_photo", "turn_on_setting")


def sim_event(
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    rng: random.Random,
    *,
    run: str = "test",
    version: int = 0,
    episode_id: str | None = None,
    prompter: Prompter | None = None,
    screenshots: ScreenshotStore | None = None,
    base_model: str = "tiny",
) -> TrajectoryEvent:
    """One random-play episode of ``task`` as a collector would publish it (prompts in ``prompter``'s format; with
    ``screenshots``, each screen's PNG stored there and claimed by its step)."""
    env = SimEnv(screenshots=screenshots is not None)
    policy = ScriptedPolicy(env, tokenizer, noise=1.0, rng=rng, version=version)
    episode_id = episode_id or uuid.uuid4().hex
    episode = run_episode(
        env,
        task,
        policy,  # type: ignore[arg-type]
        "choice",
        episode_id=episode_id,
        prompter=prompter,
        screenshots=screenshots,
    )
    outcome = asyncio.run(episode)
    return outcome.to_event(run=run, collector_id="test-collector", mode="choice", base_model=base_model)


def sim_events(
    tokenizer: PreTrainedTokenizerBase,
    n: int,
    *,
    seed: int = 0,
    run: str = "test",
    version: int = 0,
    screenshots: ScreenshotStore | None = None,
    base_model: str = "tiny",
    prompter: Prompter | None = None,
) -> list[TrajectoryEvent]:
    """``n`` random-play episodes over the train tasks of :data:`TEMPLATES` (with ``screenshots``: with a PNG of
    every screen; prompts in ``prompter``'s format, the raw one by default)."""
    rng = random.Random(seed)
    tasks = sim_tasks("train", 40, TEMPLATES)
    return [
        sim_event(
            tokenizer,
            rng.choice(tasks),
            rng,
            run=run,
            version=version,
            screenshots=screenshots,
            base_model=base_model,
            prompter=prompter,
        )
        for _ in range(n)
    ]
