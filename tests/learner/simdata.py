"""Trajectory events of the simulated phone for learner tests: random play in choice mode, real token ids.

The actions are tokenised as the tiny model's tokenizer spells them (plus the end-of-text stop token), so the learner
can recompute log π on them under the choice constraint; the behaviour log-prob is that of a uniform choice among the
candidates (what matters here is the plumbing, not the policy).
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from datetime import timedelta

import numpy as np
from transformers import PreTrainedTokenizerBase

from distrl_stream.envs.base import Task
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.events import Step, Tensor, Termination, TrajectoryEvent, utc_now

TEMPLATES = ("take_photo", "turn_on_setting")


def sim_event(
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    rng: random.Random,
    *,
    run: str = "test",
    version: int = 0,
    episode_id: str | None = None,
) -> TrajectoryEvent:
    """One random-play episode of ``task`` as a collector would publish it."""
    return asyncio.run(_play(tokenizer, task, rng, run, version, episode_id or uuid.uuid4().hex))


async def _play(
    tokenizer: PreTrainedTokenizerBase, task: Task, rng: random.Random, run: str, version: int, episode_id: str
) -> TrajectoryEvent:
    env = SimEnv()
    started = utc_now()
    observation = await env.reset(task)
    steps: list[Step] = []
    while True:
        candidates = env.candidates(observation)
        action = rng.choice(candidates)
        result = await env.step(action)
        ids = [*tokenizer(action)["input_ids"], tokenizer.eos_token_id]
        logprob = -math.log(len(candidates))
        steps.append(
            Step(
                observation=observation.screen,
                candidates=candidates,
                action_text=action,
                action=result.info.action_text,
                valid=result.info.valid,
                reward=result.reward,
                done=result.done,
                behaviour_logprob=logprob,
                token_ids=Tensor.from_numpy(np.asarray(ids, dtype=np.int32)),
                token_logprobs=Tensor.from_numpy(np.full(len(ids), logprob / len(ids), dtype=np.float32)),
                policy_version=version,
                inference_latency_s=0.01,
                env_latency_s=result.info.latency_s,
            )
        )
        if result.done or result.truncated:
            success = result.info.success
            termination = (
                Termination.SUCCESS if success else Termination.TRUNCATED if result.truncated else Termination.FAILURE
            )
            return TrajectoryEvent(
                run=run,
                episode_id=episode_id,
                collector_id="test-collector",
                env_kind="sim",
                task_id=task.id,
                task_template=task.template,
                instruction=observation.instruction,
                split=task.split,
                mode="choice",
                base_model="tiny",
                started_at=started,
                ended_at=started + timedelta(seconds=1),
                termination=termination,
                total_reward=sum(s.reward for s in steps),
                success=success,
                steps=steps,
            )
        observation = result.observation


def sim_events(
    tokenizer: PreTrainedTokenizerBase, n: int, *, seed: int = 0, run: str = "test", version: int = 0
) -> list[TrajectoryEvent]:
    """``n`` random-play episodes over the train tasks of :data:`TEMPLATES`."""
    rng = random.Random(seed)
    tasks = sim_tasks("train", 40, TEMPLATES)
    return [sim_event(tokenizer, rng.choice(tasks), rng, run=run, version=version) for _ in range(n)]
