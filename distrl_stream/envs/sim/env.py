"""The simulated phone as a :class:`~distrl_stream.envs.base.DeviceEnv`, its latency model, and its text corpus."""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from distrl_stream.envs.actions import (
    Action,
    Click,
    InvalidAction,
    LongPress,
    NavigateBack,
    NavigateHome,
    Scroll,
    TypeText,
    parse_action,
)
from distrl_stream.envs.base import EnvBase, EnvKind, Observation, Outcome, Split, Task
from distrl_stream.envs.seeding import stable_int
from distrl_stream.envs.sim.oracle import Op, next_action
from distrl_stream.envs.sim.render import screen_png
from distrl_stream.envs.sim.templates import TEMPLATES, field_texts, instantiate, iter_vocabulary, sim_tasks
from distrl_stream.envs.sim.world import World
from distrl_stream.errors import EnvError

_HOME_TITLE = "Home"


@dataclass(frozen=True)
class LatencyModel:
    """How long the simulated device takes per step: log-normal around a per-task scale.

    Real devices differ a lot between tasks (the DistRL paper reports step times spanning about 100x on Android), so
    each task gets a fixed scale drawn log-uniformly over ``task_spread`` (max/min ratio), and each step draws
    log-normal noise of width ``sigma`` around it. Both are normalised so that the mean step latency over many tasks
    is ``mean_s``. The env ``await``s the latency (asyncio.sleep): it never burns CPU.

    Attributes:
        mean_s: mean seconds per step over tasks and steps; 0 turns latency off.
        sigma: log-normal width of the per-step noise within a task.
        task_spread: ratio between the slowest and the fastest task's scale (1 = all tasks alike).
    """

    mean_s: float = 0.0
    sigma: float = 0.5
    task_spread: float = 100.0

    def task_scale(self, task: Task, seed: int = 0) -> float:
        """The task's latency multiplier (mean 1 over tasks), fixed by the task and the env seed."""
        if self.task_spread <= 1.0:
            return 1.0
        half = math.log(self.task_spread) / 2
        u = random.Random(stable_int(f"latency:{seed}:{task.seed}")).random()
        # Mean of a log-uniform variable on [e^-h, e^h] is (e^h - e^-h) / 2h; divide it out so the mean stays 1.
        return math.exp(-half + 2 * half * u) * (2 * half) / (math.exp(half) - math.exp(-half))

    def sample(self, scale: float, rng: random.Random) -> float:
        """One step's latency in seconds for a task of the given scale."""
        if self.mean_s <= 0:
            return 0.0
        return self.mean_s * scale * math.exp(self.sigma * rng.gauss(0.0, 1.0) - self.sigma**2 / 2)


def observe(world: World, task: Task, *, screenshot: bool = False) -> Observation:
    """The observation of the world's current screen, with its PNG (:func:`screen_png`) when ``screenshot``."""
    screen, elements = world.render()
    return Observation(task.instruction, screen, elements, screen_png(world.title(), elements) if screenshot else None)


def candidate_actions(observation: Observation, task: Task) -> list[str]:
    """Choice-mode candidates on a screen of the simulator: a small set that can solve every task.

    Clicks on clickable elements, long presses where they do something, the task's texts (plus distractors) for each
    text field, scrolls where the list says there is more, and back/home off the home screen. Other valid actions
    (open_app, wait, status, keyboard_enter, focusing a field, clicks by x/y) are accepted in free mode but not
    offered: they never shorten a solution over this set and would only lengthen every prompt.
    """
    out: list[str] = []
    for el in observation.elements:
        if el.editable:
            out.extend(_type_text(el.index, text) for text in field_texts(task, el.text))
        elif el.clickable:
            out.append(_click_text(el.index))
        if el.long_clickable:
            out.append(_long_press_text(el.index))
        if el.kind == "text" and el.text in _SCROLL_MARKS:
            out.append(_SCROLL_MARKS[el.text])
    if observation.screen.partition("\n")[0] != _HOME_TITLE:
        out.extend(_BACK_HOME)
    return out


# Candidate strings are rendered on every step; caching them keeps the simulator well above 5,000 steps/s.
@functools.cache
def _click_text(index: int) -> str:
    return Click(index=index).to_text()


@functools.cache
def _long_press_text(index: int) -> str:
    return LongPress(index=index).to_text()


@functools.lru_cache(maxsize=4096)
def _type_text(index: int, text: str) -> str:
    return TypeText(text=text, index=index).to_text()


_SCROLL_MARKS: Final = {
    "More above": Scroll(direction="up").to_text(),
    "More below": Scroll(direction="down").to_text(),
}
_BACK_HOME: Final = (NavigateBack().to_text(), NavigateHome().to_text())


class SimEnv(EnvBase):
    """The simulated phone. Deterministic: the same task (and env seed) gives the same world and transitions.

    Args:
        latency: the step-latency model; None (or ``mean_s=0``) for no latency.
        seed: seeds the latency noise (together with each task's seed); the world depends on the task alone.
        screenshots: attach a PNG of the screen (:func:`~distrl_stream.envs.sim.render.screen_png`) to every
            observation.
    """

    kind: EnvKind = "sim"

    def __init__(self, latency: LatencyModel | None = None, seed: int = 0, *, screenshots: bool = False) -> None:
        super().__init__()
        self._latency = latency if latency is not None and latency.mean_s > 0 else None
        self._seed = seed
        self._screenshots = screenshots
        self._world: World | None = None
        self._ops: list[Op] = []
        self._scale = 1.0
        self._rng = random.Random(seed)
        self._params: dict[str, str] = {}
        self._cached: tuple[Observation, list[str]] | None = None

    @property
    def world(self) -> World:
        """The live world of the current episode (read it; acting goes through ``step``)."""
        if self._world is None:
            raise EnvError("sim: no episode yet; call reset()")
        return self._world

    def oracle_action(self) -> Action | None:
        """The shortest-path oracle's next action from the current state (None once the task is done)."""
        return next_action(self.world, self._ops)

    def is_success(self) -> bool:
        """The task's success check on the current world."""
        task = self.task
        return task is not None and TEMPLATES[task.template].success(self.world, self._params)

    def candidates(self, observation: Observation) -> list[str]:
        """Choice-mode candidates for ``observation`` (a screen of the current task); see :func:`candidate_actions`."""
        if self.task is None:
            raise EnvError("sim: candidates() before reset()")
        if self._cached is not None and self._cached[0] is observation:
            return list(self._cached[1])
        options = candidate_actions(observation, self.task)
        self._cached = (observation, options)
        return list(options)

    async def close(self) -> None:
        """Nothing to release: the simulator lives in this process."""

    async def _reset(self, task: Task) -> Observation:
        template = TEMPLATES.get(task.template)
        if task.env != "sim" or template is None:
            raise EnvError(f"sim: cannot run task {task.id} (env {task.env}, template {task.template})")
        params, world, instruction = instantiate(template, task.seed)
        if tuple(sorted(params.items())) != task.params or instruction != task.instruction:
            raise EnvError(
                f"sim: task {task.id} does not match what its template builds from seed {task.seed}; "
                "it was made by a different version of the simulator"
            )
        self._world, self._params, self._ops = world, params, template.ops(params)
        if self._latency is not None:
            self._scale = self._latency.task_scale(task, self._seed)
            self._rng = random.Random(stable_int(f"steps:{self._seed}:{task.seed}"))
        return observe(world, task, screenshot=self._screenshots)

    async def _apply(self, action: Action) -> Outcome:
        world, task, shown = self.world, self.task, self._observation
        assert task is not None and shown is not None  # EnvBase.step checks the episode is live
        extra = {}
        if self._latency is not None:
            delay = self._latency.sample(self._scale, self._rng)
            extra["modeled_latency_s"] = delay
            await asyncio.sleep(delay)
        applied = world.apply(action)
        if not applied.valid:
            return Outcome(shown, valid=False, reason=applied.reason, extra=extra)
        success = TEMPLATES[task.template].success(world, self._params)
        return Outcome(
            observe(world, task, screenshot=self._screenshots),
            success=success,
            done=applied.status is not None,
            extra=extra,
        )


def sim_corpus(n_tasks: int, split: Split = "train", random_rollouts: int = 1, seed: int = 0) -> Iterator[str]:
    """Texts a tokenizer for the simulator should know: vocabulary, observations and candidates.

    Yields every name/label the simulator can type or show, then, for ``n_tasks`` tasks, the observation text and
    each candidate string at every step of the oracle's rollout and of ``random_rollouts`` uniformly random
    rollouts (which reach the screens the oracle never visits). Deterministic for given arguments.

    Args:
        n_tasks: tasks to roll out (round-robin over all templates).
        split: which split's tasks.
        random_rollouts: random-play episodes per task besides the oracle's.
        seed: seeds the random rollouts.
    """
    yield from iter_vocabulary()
    rng = random.Random(seed)
    for task in sim_tasks(split, n_tasks):
        template = TEMPLATES[task.template]
        for rollout in range(1 + random_rollouts):
            params, world, _ = instantiate(template, task.seed)
            ops = template.ops(params)
            for _ in range(task.horizon):
                obs = observe(world, task)
                options = candidate_actions(obs, task)
                yield obs.text
                yield from options
                action = next_action(world, ops) if rollout == 0 else None
                if action is None and rollout == 0:
                    break
                if action is None:
                    world.apply(_parse_candidate(rng.choice(options)))
                else:
                    world.apply(action)
                if template.success(world, params):
                    break


def _parse_candidate(text: str) -> Action:
    action = parse_action(text)
    assert not isinstance(action, InvalidAction), text  # candidates are canonical by construction
    return action
