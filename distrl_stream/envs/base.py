"""The protocol every environment speaks, and the records that cross it.

A collector drives any environment the same way::

    obs = await env.reset(task)
    while True:
        options = env.candidates(obs)           # canonical action strings valid on this screen (choice mode)
        result = await env.step(model_text)     # raw model text, or a parsed Action / InvalidAction
        ...                                     # record obs.text, options, result.info.action_text, ...
        if result.done or result.truncated:
            break
        obs = result.observation
    await env.close()

``step`` accepts the model's raw text and parses it itself, so the validity verdict, the reason and the canonical
text always come from one place (``EnvBase.parse``: :func:`distrl_stream.envs.actions.parse_action`, which BrowserGym
extends with its own high-level actions). An invalid action (unparseable,
or impossible on this screen) leaves the world unchanged, earns reward 0, still uses up one step of the horizon, and
is reported in ``result.info`` with its reason.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from distrl_stream.envs.actions import Action, InvalidAction, parse_action
from distrl_stream.errors import EpisodeStateError

Split = Literal["train", "test"]
EnvKind = Literal["sim", "miniwob", "android", "browsergym", "gymnasium"]


@dataclass(frozen=True, slots=True)
class UIElement:
    """One numbered element of a screen, as the policy sees it.

    Attributes:
        index: the number actions refer to (``{"action_type":"click","index":3}``); 0-based, in screen order.
        kind: a short role name: ``button``, ``toggle``, ``checkbox``, ``field``, ``item``, ``app``, ``link``,
            ``text``, ``list``.
        text: the label (or a field's hint).
        state: what the element shows beyond its label: ``on``/``off``, ``checked``/``unchecked``, a field's
            current value, ``focused``; empty when nothing.
        clickable: whether ``click`` on it does something.
        long_clickable: whether ``long_press`` on it does something.
        editable: whether ``type`` can target it.
        bounds: pixel box ``(left, top, right, bottom)`` where the environment knows it (``click`` by x, y).
    """

    index: int
    kind: str
    text: str
    state: str = ""
    clickable: bool = False
    long_clickable: bool = False
    editable: bool = False
    bounds: tuple[int, int, int, int] | None = None

    def render(self) -> str:
        """One line of the screen text, e.g. ``[2] toggle Wi-Fi: off``."""
        line = f"[{self.index}] {self.kind} {self.text}"
        return f"{line}: {self.state}" if self.state else line


@dataclass(frozen=True, slots=True)
class Observation:
    """What the agent sees at one step.

    Attributes:
        instruction: the task in natural language.
        screen: text rendering of the screen: its title (``Settings``), then one numbered line per element.
        elements: the elements behind that text, for adapters and validators.
        screenshot: PNG bytes when screenshots are on: MiniWoB and Android capture them, the simulator draws its
            screen (``envs/sim/render.py``).
    """

    instruction: str
    screen: str
    elements: tuple[UIElement, ...] = ()
    screenshot: bytes | None = None

    @property
    def text(self) -> str:
        """The observation as one text: ``Task: ...``, then ``Screen: TITLE`` and the element lines."""
        return f"Task: {self.instruction}\nScreen: {self.screen}"


@dataclass(frozen=True, slots=True)
class Task:
    """One thing to do, reproducible from its fields alone.

    Attributes:
        id: unique and stable across runs, e.g. ``sim/set_alarm/1234``.
        env: which environment kind runs it.
        template: the task family (a sim template name, a MiniWoB task name, ``android``).
        instruction: natural-language goal shown to the agent.
        split: ``train`` or held-out ``test``.
        horizon: the most steps an episode may take before it is truncated.
        seed: seeds everything random about the task's world.
        params: the template's parameter values, as sorted ``(name, value)`` pairs.
    """

    id: str
    env: EnvKind
    template: str
    instruction: str
    split: Split
    horizon: int
    seed: int
    params: tuple[tuple[str, str], ...] = ()

    def param(self, name: str, default: str = "") -> str:
        """A template parameter's value."""
        return dict(self.params).get(name, default)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What happened at one step beyond the observation.

    Attributes:
        success: the environment's own check (or the judge's verdict) says the task is now complete.
        valid: the action parsed and was possible on the screen it was sent to.
        reason: why the action was invalid (None when valid).
        action: the parsed action (a TextAction in an environment's own syntax; None when the text did not parse).
        action_text: the canonical text of the parsed action, or the raw text when it did not parse.
        latency_s: wall-clock seconds the environment took for this step (simulated device latency included).
        step: 1-based number of this step in the episode.
        extra: environment-specific details (e.g. MiniWoB's raw reward), JSON-serialisable.
    """

    success: bool
    valid: bool
    reason: str | None
    action: Action | TextAction | None
    action_text: str
    latency_s: float
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepResult:
    """The outcome of one ``step``.

    Attributes:
        observation: the screen after the action (unchanged after an invalid action).
        reward: 1.0 at the step that completes the task, else 0.0 (sparse, as in DistRL).
        done: the episode ended: success, a ``status`` action, or the environment ended it (MiniWoB).
        truncated: the horizon ran out before the episode ended.
        info: validity, success, latency and details.
    """

    observation: Observation
    reward: float
    done: bool
    truncated: bool
    info: StepInfo


@dataclass(frozen=True, slots=True)
class TextAction:
    """An action in an environment's own text syntax: one of BrowserGym's calls (``click("13")``), or the text a
    Gymnasium env with a text action space takes. Valid by the environment's parse; carried out as written."""

    text: str

    def to_text(self) -> str:
        """The action as the environment runs it."""
        return self.text


ActionInput = str | Action | TextAction | InvalidAction


@runtime_checkable
class DeviceEnv(Protocol):
    """A device the agent controls, one episode at a time. Implementations: sim, MiniWoB++, Android (adb).

    An instance runs one episode at a time and is not shared between tasks running concurrently; collectors create
    one per concurrent episode slot. ``step`` after the episode ended or before ``reset`` raises
    :class:`~distrl_stream.errors.EpisodeStateError` (a collector bug, not bad model output).
    """

    kind: EnvKind

    async def reset(self, task: Task) -> Observation:
        """Start ``task`` from its initial state and return the first observation."""
        ...

    async def step(self, action: ActionInput) -> StepResult:
        """Apply one action: raw model text (parsed here), a parsed action, or an already-invalid one."""
        ...

    def candidates(self, observation: Observation) -> list[str]:
        """Canonical action strings valid on this screen, for choice mode (empty when it cannot enumerate them)."""
        ...

    async def close(self) -> None:
        """Release the device (browser, adb connection). Idempotent."""
        ...


def action_text(action: Action | TextAction | InvalidAction) -> str:
    """Canonical text of a parsed action, or the raw text of an invalid one."""
    return action.raw if isinstance(action, InvalidAction) else action.to_text()


def render_screen(title: str, elements: tuple[UIElement, ...] | list[UIElement]) -> str:
    """The screen text every adapter uses: the screen's title, then one line per element."""
    return "\n".join([title, *(element.render() for element in elements)])


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an environment's ``_apply`` reports; :class:`EnvBase` turns it into a :class:`StepResult`.

    Attributes:
        observation: the screen after the action (the unchanged screen when the action was impossible).
        valid: whether the action was possible here.
        reason: why not, when it was not.
        success: the task is complete now.
        done: the episode ended for another reason (a ``status`` action, the page ended it).
        extra: environment-specific details for ``StepInfo.extra``.
    """

    observation: Observation
    valid: bool = True
    reason: str | None = None
    success: bool = False
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class EnvBase(ABC):
    """Episode bookkeeping shared by the adapters: parsing, step counting, horizon, rewards, latency.

    Subclasses implement ``_reset`` and ``_apply``; everything a collector relies on being uniform (when an episode
    is over, how invalid text is reported, what the reward is) lives here once.
    """

    kind: EnvKind

    def __init__(self) -> None:
        self._task: Task | None = None
        self._observation: Observation | None = None
        self._steps = 0
        self._over = True

    @property
    def task(self) -> Task | None:
        """The task of the current (or last) episode."""
        return self._task

    @property
    def steps(self) -> int:
        """Steps taken in the current episode."""
        return self._steps

    async def reset(self, task: Task) -> Observation:
        """Start ``task`` from its initial state and return the first observation."""
        self._over, self._task, self._observation = True, task, None
        observation = await self._reset(task)
        self._observation, self._steps, self._over = observation, 0, False
        return observation

    async def step(self, action: ActionInput) -> StepResult:
        """Apply one action (raw text or parsed); see :class:`DeviceEnv`."""
        if self._task is None or self._observation is None:
            raise EpisodeStateError(f"{self.kind}: step() before reset()")
        if self._over:
            raise EpisodeStateError(f"{self.kind}: step() after episode {self._task.id} ended; call reset()")
        parsed = self.parse(action) if isinstance(action, str) else action
        started = time.perf_counter()
        if isinstance(parsed, InvalidAction):
            # Nothing reaches the device: the world is unchanged by construction.
            outcome = Outcome(self._observation, valid=False, reason=parsed.reason)
        else:
            outcome = await self._apply(parsed)
        latency = time.perf_counter() - started
        self._steps += 1
        self._observation = outcome.observation
        success = outcome.valid and outcome.success
        done = success or outcome.done
        truncated = not done and self._steps >= self._task.horizon
        self._over = done or truncated
        info = StepInfo(
            success=success,
            valid=outcome.valid,
            reason=outcome.reason,
            action=None if isinstance(parsed, InvalidAction) else parsed,
            action_text=action_text(parsed),
            latency_s=latency,
            step=self._steps,
            extra=outcome.extra,
        )
        return StepResult(outcome.observation, 1.0 if success else 0.0, done, truncated, info)

    async def __aenter__(self) -> EnvBase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def parse(self, text: str) -> Action | TextAction | InvalidAction:
        """Read the model's text as an action: the project's JSON actions (BrowserGym also reads its own calls, a
        Gymnasium env its own text)."""
        return parse_action(text)

    @abstractmethod
    def candidates(self, observation: Observation) -> list[str]:
        """Canonical action strings valid on this screen."""

    @abstractmethod
    async def close(self) -> None:
        """Release the device. Idempotent."""

    @abstractmethod
    async def _reset(self, task: Task) -> Observation:
        """Bring the device to the task's initial state."""

    @abstractmethod
    async def _apply(self, action: Action | TextAction) -> Outcome:
        """Carry out a parsed action (or refuse it, leaving the world unchanged)."""
