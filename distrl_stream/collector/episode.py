"""One episode: reset → observe → prompt → ask the policy server → step → record, until the episode ends.

This is the loop both collection modes share. It turns what the environment and the server did into the
:class:`~distrl_stream.events.Step` records of a trajectory, exactly as the learner needs them to rebuild each
prompt (the run's :class:`~distrl_stream.policy.prompt.Prompter` on ``event.instruction``, ``step.observation``,
``[s.action_text for s in earlier steps]`` and ``step.candidates``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import numpy as np

from distrl_stream.config import EnvConfig
from distrl_stream.envs.base import DeviceEnv, Observation, Task
from distrl_stream.events import Step, Tensor, Termination, TrajectoryEvent, utc_now
from distrl_stream.events.screenshots import ScreenshotStore
from distrl_stream.inference.client import ActionResult, Mode
from distrl_stream.policy.prompt import Prompt, Prompter

log = logging.getLogger(__name__)


class Policy(Protocol):
    """What acts in an episode: the inference client, or a scripted/random reference
    (:class:`~distrl_stream.testing.scripted.ScriptedPolicy`)."""

    async def act(
        self, prompt: Prompt, candidates: Sequence[str] | None = None, *, mode: Mode = "choice"
    ) -> ActionResult: ...


def policy_env(section: EnvConfig, prompter: Prompter) -> EnvConfig:
    """The environment settings episodes run with: a vision policy's environments capture a screenshot of every
    screen (its prompt needs one), whatever ``env.screenshots`` says."""
    return section.model_copy(update={"screenshots": True}) if prompter.vision else section


@dataclass(frozen=True)
class EpisodeOutcome:
    """How an episode went.

    Attributes:
        episode_id: its id (the trajectory's Kafka key).
        task: the task it attempted.
        instruction: the instruction the policy was prompted with (the first observation's).
        started_at: when ``reset`` was called (UTC, millisecond precision).
        ended_at: when it ended.
        steps: the recorded steps, in order (fewer than taken only when an error cut a step short).
        termination: success, failure, truncated, inference_error or env_error.
        error: what went wrong, for the two error terminations.
        final_observation: truncated episodes: the screen after the last step (s_L, which the learner bootstraps
            its value from).
        final_candidates: truncated choice-mode episodes: the actions offered on ``final_observation``.
    """

    episode_id: str
    task: Task
    instruction: str
    started_at: datetime
    ended_at: datetime
    steps: list[Step]
    termination: Termination
    error: str | None = None
    final_observation: str | None = None
    final_candidates: list[str] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """Whether the environment judged the task done."""
        return self.termination is Termination.SUCCESS

    @property
    def total_reward(self) -> float:
        """Sum of the steps' rewards."""
        return sum(step.reward for step in self.steps)

    def to_event(
        self, *, run: str, collector_id: str, mode: Mode, base_model: str, base_fingerprint: str = ""
    ) -> TrajectoryEvent:
        """The trajectory event that publishes this episode (key: ``episode_id``)."""
        return TrajectoryEvent(
            run=run,
            episode_id=self.episode_id,
            collector_id=collector_id,
            env_kind=self.task.env,
            task_id=self.task.id,
            task_template=self.task.template,
            instruction=self.instruction,
            split=self.task.split,
            mode=mode,
            base_model=base_model,
            started_at=self.started_at,
            ended_at=self.ended_at,
            termination=self.termination,
            total_reward=self.total_reward,
            success=self.success,
            steps=self.steps,
            final_observation=self.final_observation,
            final_candidates=self.final_candidates,
            base_fingerprint=base_fingerprint,
        )


StepCallback = Callable[[Step], None]


async def run_episode(
    env: DeviceEnv,
    task: Task,
    policy: Policy,
    mode: Mode,
    *,
    episode_id: str,
    on_step: StepCallback | None = None,
    screenshots: ScreenshotStore | None = None,
    prompter: Prompter | None = None,
) -> EpisodeOutcome:
    """Run one episode of ``task`` on ``env`` with actions from ``policy``.

    In choice mode the policy picks among ``env.candidates(obs)``; a screen without candidates (an environment that
    cannot enumerate them) is asked in free mode, and its step records no candidates and ``mode = "free"``. Every
    step records the version that produced its action, so an episode may span versions.

    Errors never escape: an exception from the policy ends the episode as ``inference_error``, one from the
    environment (reset, candidates, screenshot, step) as ``env_error``; the steps completed before it are kept.
    Cancellation (shutdown) propagates.

    Args:
        env: the environment (this call owns it until it returns).
        task: what to do.
        policy: what acts (:class:`Policy`: the inference client, or a scripted reference).
        mode: ``choice`` or ``free``.
        episode_id: the id to record.
        on_step: called with each recorded step (metrics).
        screenshots: where observation screenshots go; None records none.
        prompter: the base model's prompt format (:func:`~distrl_stream.policy.model_dir.load_prompter`); None: the
            raw format of the local tiny models. A vision policy's prompt takes the observation's screenshot
            (environments built from :func:`policy_env` capture one).
    """
    prompter = prompter or Prompter()
    started_at = utc_now()
    steps: list[Step] = []
    previous: list[str] = []
    instruction = task.instruction

    def end(termination: Termination, error: str | None = None, final: Observation | None = None) -> EpisodeOutcome:
        outcome = EpisodeOutcome(episode_id, task, instruction, started_at, utc_now(), steps, termination, error)
        if final is None:
            return outcome
        try:
            candidates = env.candidates(final) if mode == "choice" else []
        except Exception as exc:  # the episode is complete: publish it with s_L alone rather than lose it
            log.warning(
                "episode %s: no candidates for the final observation: %s", episode_id, _describe("observe", exc)
            )
            candidates = []
        return dataclasses.replace(outcome, final_observation=final.screen, final_candidates=list(candidates))

    try:
        observation = await env.reset(task)
    except Exception as exc:
        return end(Termination.ENV_ERROR, _describe("reset", exc))
    instruction = observation.instruction
    while True:
        try:
            candidates = env.candidates(observation) if mode == "choice" else []
            screenshot = await _screenshot(observation, screenshots)
        except Exception as exc:
            return end(Termination.ENV_ERROR, _describe("observe", exc))
        if prompter.vision and observation.screenshot is None:
            return end(Termination.ENV_ERROR, "observe: no screenshot of the screen for a policy that reads them")
        prompt = prompter(instruction, observation.screen, previous, candidates, screenshot=observation.screenshot)
        step_mode: Mode = "choice" if candidates else "free"
        try:
            action = await policy.act(prompt, candidates or None, mode=step_mode)
        except Exception as exc:  # InferenceError, or a malformed answer the client did not anticipate
            return end(Termination.INFERENCE_ERROR, _describe("inference", exc))
        try:
            result = await env.step(action.text)
        except Exception as exc:
            return end(Termination.ENV_ERROR, _describe("step", exc))
        info = result.info
        step = Step(
            observation=observation.screen,
            screenshot_uri=screenshot[0] if screenshot else None,
            screenshot_sha256=screenshot[1] if screenshot else None,
            candidates=list(candidates),
            action_text=action.text,
            action=info.action_text if info.valid else "",
            valid=info.valid,
            invalid_reason=info.reason,
            reward=result.reward,
            done=result.done,
            behaviour_logprob=action.logprob,
            token_ids=Tensor.from_numpy(np.asarray(action.token_ids, dtype=np.int32)),
            token_logprobs=Tensor.from_numpy(np.asarray(action.token_logprobs, dtype=np.float32)),
            policy_version=action.version,
            inference_latency_s=action.latency_s,
            env_latency_s=info.latency_s,
            server=action.server,
            adapter_sha256=action.adapter_sha256,
            # What the policy read, as its server tokenised it: the learner trains on these ids (docs/design.md §6.2).
            prompt_token_ids=Tensor.from_token_ids(action.prompt_token_ids) if action.prompt_token_ids else None,
            # Per step: the learner recomputes log π as this step was asked, whatever the episode's mode.
            mode=step_mode,
        )
        steps.append(step)
        previous.append(action.text)
        if on_step is not None:
            on_step(step)
        if result.done or result.truncated:
            if info.success:
                return end(Termination.SUCCESS)
            if result.truncated:
                return end(Termination.TRUNCATED, final=result.observation)
            return end(Termination.FAILURE)
        observation = result.observation


async def _screenshot(observation: Observation, store: ScreenshotStore | None) -> tuple[str, str] | None:
    if store is None or observation.screenshot is None:
        return None
    return await store.put(observation.screenshot)


def _describe(where: str, exc: BaseException) -> str:
    return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
