"""The episode loop on the simulated phone with the scripted policy (no server): what a truncated episode records."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from distrl_stream.collector import run_episode
from distrl_stream.envs.base import Observation
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.envs.sim.env import observe
from distrl_stream.events import Termination, TrajectoryEvent, decode, encode
from distrl_stream.events.screenshots import ScreenshotStore, read_screenshot
from distrl_stream.learner.records import episode_from_event
from distrl_stream.policy.logprobs import text_tokenizer
from distrl_stream.policy.model import build_model
from distrl_stream.policy.prompt import ImagePrompt, Prompt, Prompter
from distrl_stream.policy.vision import load_processor
from distrl_stream.testing.scripted import ScriptedPolicy


def _play(tiny_model_dir: Path, horizon: int) -> tuple[SimEnv, TrajectoryEvent]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = dataclasses.replace(sim_tasks("train", 1, ["take_photo"])[0], horizon=horizon)
    env = SimEnv()
    policy = ScriptedPolicy(env, tokenizer, noise=0.0, rng=random.Random(0))  # the oracle: no random ending
    outcome = asyncio.run(run_episode(env, task, policy, "choice", episode_id="e1"))
    return env, outcome.to_event(run="r", collector_id="c", mode="choice", base_model="tiny")


def test_a_truncated_episode_records_the_screen_after_its_last_step(tiny_model_dir: Path) -> None:
    env, event = _play(tiny_model_dir, horizon=1)  # take_photo needs two steps: the horizon cuts it after one
    assert event.termination is Termination.TRUNCATED and len(event.steps) == 1
    assert event.final_observation != event.steps[0].observation
    assert env.task is not None
    final = observe(env.world, env.task)  # the screen the env is on now, after the last step
    assert event.final_observation == final.screen
    assert event.final_candidates == env.candidates(final)


def test_a_finished_episode_records_no_final_observation(tiny_model_dir: Path) -> None:
    _env, event = _play(tiny_model_dir, horizon=10)
    assert event.termination is Termination.SUCCESS
    assert (event.final_observation, event.final_candidates) == (None, [])


class _Recording(ScriptedPolicy):
    """The oracle, keeping every prompt it was given."""

    prompts: list[Prompt]

    async def act(self, prompt: Prompt, candidates: Sequence[str] | None = None, *, mode: str = "choice") -> Any:
        self.prompts.append(prompt)
        return await super().act(prompt, candidates, mode=mode)


def test_a_vision_policy_is_prompted_with_each_screen_and_its_claim_check(tmp_path: Path) -> None:
    vl_dir = build_model(tmp_path / "tiny-vl", "tiny-vl")
    processor = load_processor(vl_dir)
    prompter = Prompter(processor, vision=True)
    task = sim_tasks("train", 1, ["take_photo"])[0]
    store = ScreenshotStore(tmp_path / "shots")

    def play(env: SimEnv) -> tuple[_Recording, Any]:
        policy = _Recording(env, text_tokenizer(processor), noise=0.0, rng=random.Random(0))
        policy.prompts = []
        episode = run_episode(env, task, policy, "choice", episode_id="e", screenshots=store, prompter=prompter)
        return policy, asyncio.run(episode)

    policy, outcome = play(SimEnv(screenshots=True))
    assert outcome.termination is Termination.SUCCESS and policy.prompts
    for prompt, step in zip(policy.prompts, outcome.steps, strict=True):
        assert isinstance(prompt, ImagePrompt) and prompt.image_sha256 == step.screenshot_sha256
        assert read_screenshot(step.screenshot_uri or "", prompt.image_sha256) == prompt.png
    # An environment that draws no screenshot cannot serve a vision policy: the episode ends, named, unprompted.
    policy, outcome = play(SimEnv())
    assert outcome.termination is Termination.ENV_ERROR and not policy.prompts
    assert outcome.error == "observe: no screenshot of the screen for a policy that reads them"


class _FirstScreenWithoutCandidates(SimEnv):
    """The simulator, listing no candidates for its first screen (as an env that cannot enumerate a screen's)."""

    hidden: list[str] | None = None

    def candidates(self, observation: Observation) -> list[str]:
        candidates = super().candidates(observation)
        if self.hidden is None:
            self.hidden = candidates
            return []
        return candidates


def test_a_screen_without_candidates_is_asked_in_free_mode_and_its_step_says_so(tiny_model_dir: Path) -> None:
    env = _FirstScreenWithoutCandidates()
    asked: list[str] = []

    class Oracle(ScriptedPolicy):
        async def act(self, prompt: Prompt, candidates: Sequence[str] | None = None, *, mode: str = "choice") -> Any:
            asked.append(mode)
            return await super().act(prompt, candidates or env.hidden, mode=mode)

    policy = Oracle(env, AutoTokenizer.from_pretrained(tiny_model_dir), noise=0.0, rng=random.Random(0))
    task = sim_tasks("train", 1, ["take_photo"])[0]
    outcome = asyncio.run(run_episode(env, task, policy, "choice", episode_id="e"))
    event = outcome.to_event(run="r", collector_id="c", mode="choice", base_model="tiny")
    assert outcome.termination is Termination.SUCCESS and asked == ["free", "choice"]
    # The learner takes the episode whole (not a dead letter for "choice mode without candidates"), each step in the
    # mode it was asked in.
    episode = episode_from_event(decode(encode(event), expect=TrajectoryEvent))
    assert [s.mode for s in episode.steps] == asked
    assert episode.steps[0].choices is None and episode.steps[1].choices == event.steps[1].candidates != []
