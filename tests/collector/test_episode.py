"""The episode loop on the simulated phone with the scripted policy (no server): what a truncated episode records."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

from transformers import AutoTokenizer

from distrl_stream.collector import run_episode
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.envs.sim.env import observe
from distrl_stream.events import Termination, TrajectoryEvent
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
