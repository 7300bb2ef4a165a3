"""Task pools per environment kind and split, and the samplers collectors draw tasks from.

``task_pool(config.env, "train")`` gives the training tasks, ``task_pool(config.env, "test")`` the held-out ones.
A sampler hands out tasks and hears back how each episode went (``update``): :class:`UniformSampler` ignores the
feedback, :class:`CurriculumSampler` (``env.task_sampler = "curriculum"``) samples by recent success.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Final, Protocol, runtime_checkable

from distrl_stream.config import EnvConfig
from distrl_stream.envs.base import EnvKind, Split, Task
from distrl_stream.envs.sim.templates import sim_tasks
from distrl_stream.errors import ConfigError

# Steps a MiniWoB episode may take; the oracle needs 1 (click tasks) to 2 + targets (click-checkboxes).
MINIWOB_HORIZONS: Final[dict[str, int]] = {
    "click-test": 3,
    "click-test-2": 3,
    "click-button": 3,
    "click-link": 3,
    "focus-text": 3,
    "focus-text-2": 3,
    "enter-text": 5,
    "enter-text-2": 5,
    "click-checkboxes": 8,
    "click-dialog": 3,
    "click-tab": 3,
}
DEFAULT_MINIWOB_HORIZON: Final = 10
_TITLES: Final[dict[str, str]] = {"miniwob": "MiniWoB", "browsergym": "BrowserGym", "gymnasium": "Gymnasium"}


@runtime_checkable
class TaskSampler(Protocol):
    """Where a collector gets its next task; ``update`` reports how an episode of that task went."""

    def sample(self) -> Task:
        """The next task to run."""
        ...

    def update(self, task: Task, success: bool) -> None:
        """Feedback after an episode of ``task`` (a curriculum adapts to it; uniform sampling ignores it)."""
        ...


class UniformSampler:
    """Draws uniformly (with replacement) from a fixed pool; deterministic for a given seed.

    Args:
        tasks: the pool; must not be empty.
        seed: seeds the draws.
    """

    def __init__(self, tasks: Sequence[Task], seed: int = 0) -> None:
        if not tasks:
            raise ValueError("UniformSampler needs at least one task")
        self._tasks = list(tasks)
        self._rng = random.Random(seed)

    @property
    def tasks(self) -> list[Task]:
        """The pool."""
        return list(self._tasks)

    def sample(self) -> Task:
        """A task drawn uniformly from the pool."""
        return self._rng.choice(self._tasks)

    def update(self, task: Task, success: bool) -> None:
        """Uniform sampling does not adapt."""


class CurriculumSampler:
    """DigiRL's task curriculum: templates at the edge of the policy's ability are drawn most often.

    Each template (a family of tasks of one kind: a sim template, a MiniWoB task) keeps the outcomes of its last
    ``window`` episodes; its recent success rate p weighs it by p(1 − p) + ``floor``, the variance of its outcome,
    which is largest where the policy succeeds half the time: the tasks whose episodes carry the most learning signal
    (all-fail and all-succeed templates teach a policy gradient little). The floor keeps mastered and hopeless
    templates in the mix, so a forgotten skill or a newly reachable one is noticed. A template with no outcome yet
    counts as p = 0.5 (tried first). Within a template, tasks are drawn uniformly.

    Args:
        tasks: the pool; must not be empty.
        window: recent episodes per template its success rate is measured on.
        floor: weight added to every template. Source: ours (with 0.05 a mastered template still gets about a
            sixth of the draws of one at 50%).
        seed: seeds the draws.
    """

    def __init__(self, tasks: Sequence[Task], window: int = 20, floor: float = 0.05, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("CurriculumSampler needs at least one task")
        self._by_template: dict[str, list[Task]] = defaultdict(list)
        for task in tasks:
            self._by_template[task.template].append(task)
        self._templates = sorted(self._by_template)
        self._outcomes: dict[str, deque[bool]] = {t: deque(maxlen=window) for t in self._templates}
        self._floor = floor
        self._rng = random.Random(seed)

    def success_rate(self, template: str) -> float:
        """Recent success of ``template`` (0.5 before its first outcome)."""
        outcomes = self._outcomes[template]
        return sum(outcomes) / len(outcomes) if outcomes else 0.5

    def weights(self) -> dict[str, float]:
        """Each template's sampling weight, p(1 − p) + floor."""
        return {t: (p := self.success_rate(t)) * (1.0 - p) + self._floor for t in self._templates}

    def sample(self) -> Task:
        """A template drawn by weight, then one of its tasks uniformly."""
        weights = self.weights()
        [template] = self._rng.choices(self._templates, weights=[weights[t] for t in self._templates])
        return self._rng.choice(self._by_template[template])

    def update(self, task: Task, success: bool) -> None:
        """Record the outcome of an episode of ``task`` (tasks of templates outside the pool are ignored)."""
        if task.template in self._outcomes:
            self._outcomes[task.template].append(success)


def miniwob_tasks(
    names: Sequence[str], split: Split, n: int, env: EnvKind = "miniwob", horizon: int | None = None
) -> list[Task]:
    """``n`` MiniWoB tasks round-robin over ``names``; train uses even page seeds, test odd ones (never shared).

    The instruction of a MiniWoB task is generated by the page from the seed, so ``Task.instruction`` only names the
    task; the observation carries the real utterance. With ``env = "browsergym"`` the names are BrowserGym task ids
    (``browsergym/miniwob.click-test``; any benchmark's), with ``"gymnasium"`` the configured env, seeded the same
    way; ``horizon`` overrides MiniWoB's per-task horizons.
    """
    out = []
    for k in range(n):
        name = names[k % len(names)]
        seed = 2 * (k // len(names)) + (1 if split == "test" else 0)
        page = name.removeprefix("browsergym/miniwob.")
        out.append(
            Task(
                id=f"{env}/{name.removeprefix('browsergym/')}/{seed}",
                env=env,
                template=name,
                instruction=f"{_TITLES[env]} {name}",
                split=split,
                horizon=horizon or MINIWOB_HORIZONS.get(page, DEFAULT_MINIWOB_HORIZON),
                seed=seed,
            )
        )
    return out


def android_tasks(instructions: Sequence[str], horizon: int, split: Split) -> list[Task]:
    """Tasks from user-given instructions; the same list serves both splits (there is nothing generated to hold out)."""
    return [
        Task(f"android/{i}", "android", "android", text, split, horizon, seed=i) for i, text in enumerate(instructions)
    ]


def task_pool(section: EnvConfig, split: Split, n: int | None = None) -> list[Task]:
    """The tasks of one split for the configured environment kind.

    Args:
        section: the ``env`` config section.
        split: ``train`` or ``test``.
        n: pool size (default: ``section.pool_size``; Android: all configured instructions).

    Raises:
        ConfigError: an unknown sim template or BrowserGym task, or a pool with nothing to draw from.
    """
    size = n if n is not None else section.pool_size
    if section.kind == "sim":
        try:
            return sim_tasks(split, size, section.templates)
        except KeyError as exc:
            raise ConfigError("env.templates", str(exc.args[0])) from None
    if section.kind == "miniwob":
        if not section.miniwob_tasks:
            raise ConfigError("env.miniwob_tasks", "empty: name at least one MiniWoB task")
        return miniwob_tasks(section.miniwob_tasks, split, size)
    if section.kind == "browsergym":
        from distrl_stream.envs.browsergym import check_config

        check_config(section)
        return miniwob_tasks(section.browsergym_tasks, split, size, env="browsergym")
    if section.kind == "gymnasium":
        from distrl_stream.envs.gymnasium import check_config as check_gymnasium

        check_gymnasium(section)
        return miniwob_tasks([section.gymnasium_env], split, size, env="gymnasium", horizon=section.gymnasium_horizon)
    if not section.android_tasks:
        raise ConfigError("env.android_tasks", "empty: give the instructions of the Android tasks to run")
    return android_tasks(section.android_tasks, section.android_horizon, split)


def make_sampler(
    section: EnvConfig, split: Split = "train", n: int | None = None, seed: int | None = None
) -> UniformSampler | CurriculumSampler:
    """The configured sampler (``section.task_sampler``) over :func:`task_pool`, seeded by ``seed`` (default
    ``section.seed``). The test split is always sampled uniformly: held-out success must not depend on the policy."""
    tasks = task_pool(section, split, n)
    seed = section.seed if seed is None else seed
    if section.task_sampler == "curriculum" and split == "train":
        return CurriculumSampler(tasks, window=section.curriculum_window, seed=seed)
    return UniformSampler(tasks, seed=seed)
