"""A Gymnasium env written here, with text and image observations and a text action space, played through the
DeviceEnv protocol and by a collector episode; and the settings refused before anything starts."""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

from distrl_stream.collector import run_episode
from distrl_stream.config import EnvConfig
from distrl_stream.envs import make_env
from distrl_stream.envs.gymnasium import GymnasiumEnv
from distrl_stream.envs.tasks import task_pool
from distrl_stream.errors import ConfigError
from distrl_stream.events import TrajectoryEvent
from distrl_stream.events.serde import decode, encode

WORDS = ("apple", "pear", "plum", "fig")


class SecretWordEnv(gymnasium.Env[Any, str]):
    """Say the word the seed picked; the screen lists it among others, the picture is red."""

    def __init__(self, image: bool = True) -> None:
        self.image = image
        self.action_space = gymnasium.spaces.Text(12, charset=string.ascii_lowercase + " ")
        self.observation_space = gymnasium.spaces.Text(200)
        self.word = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return self._obs(f"Words: {', '.join(WORDS)}"), {"instruction": f"Say {self.word}", "candidates": list(WORDS)}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        right = action == self.word
        screen = "Correct" if right else f"Not {action}. Words: {', '.join(WORDS)}"
        return self._obs(screen), float(right), right, False, {"candidates": [] if right else list(WORDS)}

    def _obs(self, text: str) -> Any:
        return {"text": text, "image": np.full((8, 8, 3), (255, 0, 0), np.uint8)} if self.image else text


ENTRY_POINT = f"{__name__}:SecretWordEnv"
gymnasium.register("SecretWordText-v0", entry_point=ENTRY_POINT, kwargs={"image": False})


def section(env_id: str = ENTRY_POINT, **fields: Any) -> EnvConfig:
    return EnvConfig(kind="gymnasium", gymnasium_env=env_id, **fields)


async def test_a_text_and_image_env_is_played_through_the_device_env_protocol() -> None:
    env = make_env(section(screenshots=True))
    assert isinstance(env, GymnasiumEnv)
    task = task_pool(section(), "train", 1)[0]
    obs = await env.reset(task)
    word = obs.instruction.removeprefix("Say ")
    assert word in WORDS and obs.screen == "Words: apple, pear, plum, fig"
    assert obs.screenshot is not None and obs.screenshot.startswith(b"\x89PNG")
    assert env.candidates(obs) == list(WORDS)
    wrong = await env.step(next(w for w in WORDS if w != word))
    assert wrong.info.valid and not wrong.done and wrong.reward == 0.0 and wrong.observation.screen.startswith("Not")
    right = await env.step(word)
    assert right.done and right.info.success and right.reward == 1.0 and right.info.action_text == word
    await env.close()


async def test_a_registered_text_env_refuses_text_outside_its_action_space_and_counts_the_step() -> None:
    env = make_env(section("SecretWordText-v0", gymnasium_horizon=2))
    task = task_pool(section("SecretWordText-v0", gymnasium_horizon=2), "train", 1)[0]
    obs = await env.reset(task)
    assert obs.screen.startswith("Words:") and obs.screenshot is None
    refused = await env.step('{"action_type":"click","index":0}')
    assert not refused.info.valid and "action space" in (refused.info.reason or "") and refused.info.step == 1
    last = await env.step("banana")
    assert last.truncated and not last.info.success
    await env.close()


def test_a_collector_episode_on_a_gymnasium_env_is_a_valid_trajectory(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from distrl_stream.testing.scripted import ScriptedPolicy

    policy = ScriptedPolicy(None, AutoTokenizer.from_pretrained(tiny_model_dir), 1.0, random.Random(0))
    env = make_env(section())
    task = task_pool(section(), "train", 1)[0]
    outcome = asyncio.run(run_episode(env, task, policy, "choice", episode_id="g-1"))
    event = decode(encode(outcome.to_event(run="t", collector_id="c", mode="choice", base_model="tiny")))
    assert isinstance(event, TrajectoryEvent) and event.env_kind == "gymnasium" and event.success
    assert all(step.action in WORDS and step.candidates == list(WORDS) for step in event.steps)
    assert event.instruction.startswith("Say ") and event.steps[-1].reward == 1.0


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("no_such_module_here:Env", r"^env\.gymnasium_env: 'no_such_module_here:Env' does not import"),
        ("SecretWordTxt-v0", r"^env\.gymnasium_env: .*SecretWordTxt.*closest registered: SecretWordText-v0"),
        ("CartPole-v1", r"^env\.gymnasium_env: CartPole-v1: action space Discrete\(2\) is not gymnasium\.spaces\.Text"),
        ("", r"^env\.gymnasium_env: empty"),
    ],
)
def test_an_env_that_does_not_fit_is_refused_in_one_line_naming_the_setting(env_id: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        task_pool(section(env_id), "train")
