"""The scripted policy: the oracle's action with probability 1 − noise, and its own behaviour log-prob."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.inference.client import ActionResult
from distrl_stream.testing.scripted import ScriptedPolicy


def _first_action(tokenizer: object, noise: float) -> tuple[ActionResult, str, list[str]]:
    """The policy's answer on the first screen of a train task, the oracle's action there, and the candidates."""

    async def play() -> tuple[ActionResult, str, list[str]]:
        env = SimEnv()
        observation = await env.reset(sim_tasks("train", 1)[0])
        options = env.candidates(observation)
        oracle = env.oracle_action()
        assert oracle is not None
        policy = ScriptedPolicy(env, tokenizer, noise=noise, rng=random.Random(0), version=3)  # type: ignore[arg-type]
        return await policy.act("prompt", options), oracle.to_text(), options

    return asyncio.run(play())


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> object:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_without_noise_it_plays_the_oracle_with_probability_one(tokenizer: object) -> None:
    result, oracle, _options = _first_action(tokenizer, noise=0.0)
    assert result.text == oracle
    assert result.logprob == pytest.approx(0.0)
    assert result.version == 3
    assert result.token_ids[-1] == tokenizer.eos_token_id  # type: ignore[attr-defined]


def test_with_full_noise_it_plays_uniformly_among_the_candidates(tokenizer: object) -> None:
    result, _oracle, options = _first_action(tokenizer, noise=1.0)
    assert result.text in options
    assert result.logprob == pytest.approx(-math.log(len(options)))


def test_without_a_simulator_it_plays_uniformly_and_refuses_to_script(tokenizer: object) -> None:
    options = ["tap(1)", "tap(2)", "tap(3)", "back()"]
    policy = ScriptedPolicy(None, tokenizer, noise=1.0, rng=random.Random(0))  # type: ignore[arg-type]
    picked = {asyncio.run(policy.act("prompt", options)).text for _ in range(40)}
    assert picked == set(options)  # every candidate, from random play alone
    with pytest.raises(ValueError, match=r"noise 0\.5 follows the simulator's oracle"):
        ScriptedPolicy(None, tokenizer, noise=0.5, rng=random.Random(0))  # type: ignore[arg-type]
