"""A user's Gymnasium environment behind the DeviceEnv protocol: text (and image) in, text out.

``env.gymnasium_env`` names the environment: a registered id (``MyTextEnv-v0``, its module imported first when
given as ``module:MyTextEnv-v0``, as ``gymnasium.make`` accepts) or an entry point (``package.module:ClassName``).
The contract (docs/envs.md, "Gymnasium"):

- **observation**: a ``str`` (the screen text), or a dict with ``"text"`` (str) and optionally ``"instruction"``
  (str) and ``"image"`` (an ``H×W×3`` uint8 array, or PNG bytes) for vision policies;
- **action space**: ``gymnasium.spaces.Text``; the model's text is the action, valid when the space contains it;
- **info** (optional): ``"instruction"`` at reset (the task, when the observation does not carry it),
  ``"candidates"`` (the actions choice mode offers on this screen), ``"success"`` (the task is done; otherwise an
  episode that terminates with a positive reward succeeded).

Each episode is ``reset(seed=Task.seed)``; the user's env runs in a worker thread (``asyncio.to_thread``), so a
collector's envs overlap.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
from typing import Any

from distrl_stream.config import EnvConfig
from distrl_stream.envs.actions import Action, InvalidAction
from distrl_stream.envs.base import EnvBase, EnvKind, Observation, Outcome, Task, TextAction
from distrl_stream.envs.miniwob import png
from distrl_stream.errors import ConfigError, EnvError


class GymnasiumEnv(EnvBase):
    """One instance of the configured Gymnasium env (``Task.seed`` seeds each episode).

    Args:
        env_id: a registered id or an entry point ``module:Class``.
        kwargs: keyword arguments for the env's constructor.
        screenshots: attach the observation's image (as PNG) to every observation.
    """

    kind: EnvKind = "gymnasium"

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None, screenshots: bool = False) -> None:
        super().__init__()
        self._id = env_id
        self._kwargs = dict(kwargs or {})
        self._screenshots = screenshots
        self._env: Any = None
        self._candidates: list[str] = []

    @classmethod
    def from_config(cls, section: EnvConfig) -> GymnasiumEnv:
        """An environment set up from the ``env`` config section."""
        return cls(section.gymnasium_env, section.gymnasium_kwargs, section.screenshots)

    def parse(self, text: str) -> Action | TextAction | InvalidAction:
        """The model's text as the env's action, when its action space contains it."""
        space = self._env.action_space if self._env is not None else None
        if space is not None and not space.contains(text):
            return InvalidAction(f"not in the env's action space ({space})", text)
        return TextAction(text)

    def candidates(self, observation: Observation) -> list[str]:
        """The actions the env offered on this screen (``info["candidates"]``); none: free mode."""
        return list(self._candidates)

    async def close(self) -> None:
        """Close the user's env."""
        env, self._env = self._env, None
        if env is not None:
            await asyncio.to_thread(env.close)

    async def _reset(self, task: Task) -> Observation:
        if task.env != "gymnasium":
            raise EnvError(f"gymnasium: cannot run task {task.id} of env {task.env}")
        if self._env is None:
            self._env = await asyncio.to_thread(make, self._id, self._kwargs)
        try:
            obs, info = await asyncio.to_thread(self._env.reset, seed=task.seed)
        except Exception as exc:
            raise EnvError(f"gymnasium: {self._id} failed to reset (seed {task.seed}): {exc}") from exc
        return self._observe(obs, info, task.instruction)

    async def _apply(self, action: Action | TextAction) -> Outcome:
        shown = self._observation
        assert shown is not None  # EnvBase.step checks the episode is live
        try:
            obs, reward, terminated, truncated, info = await asyncio.to_thread(self._env.step, action.to_text())
        except Exception as exc:
            raise EnvError(f"gymnasium: {self._id} failed on {action.to_text()[:80]!r}: {exc}") from exc
        done = bool(terminated or truncated)
        success = bool(info.get("success", terminated and float(reward) > 0))
        observation = self._observe(obs, info, shown.instruction)
        return Outcome(observation, success=success, done=done, extra={"gymnasium_reward": float(reward)})

    def _observe(self, obs: Any, info: dict[str, Any], instruction: str) -> Observation:
        self._candidates = [str(c) for c in info.get("candidates") or ()]
        if isinstance(obs, str):
            return Observation(str(info.get("instruction") or instruction), obs)
        if not isinstance(obs, dict) or not isinstance(obs.get("text"), str):
            raise EnvError(f"gymnasium: {self._id} observed {type(obs).__name__}, not text or a dict with 'text'")
        image = obs.get("image")
        screenshot = None
        if self._screenshots and image is not None:
            screenshot = bytes(image) if isinstance(image, bytes | bytearray) else png(image)
        text = obs.get("instruction") or info.get("instruction") or instruction
        return Observation(str(text), obs["text"], screenshot=screenshot)


def make(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The user's env, checked against the text interface.

    Raises:
        ConfigError: the entry point does not import, the id is not registered, or the action space is not text.
    """
    import gymnasium

    try:
        module, _, name = env_id.rpartition(":")
        factory = getattr(importlib.import_module(module), name, None) if module else None
        # An entry point (module:Class), else a registered id (its module imported first when given as module:Id).
        env = factory(**kwargs) if callable(factory) else gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except ImportError as exc:
        raise ConfigError("env.gymnasium_env", f"{env_id!r} does not import: {exc}") from None
    except gymnasium.error.Error as exc:
        known = [name for name in gymnasium.envs.registry if not name.startswith("browsergym/")]
        close = difflib.get_close_matches(name, known, n=3)
        raise ConfigError("env.gymnasium_env", f"{exc} (closest registered: {', '.join(close) or 'none'})") from None
    if not isinstance(env.action_space, gymnasium.spaces.Text):
        env.close()
        raise ConfigError(
            "env.gymnasium_env", f"{env_id}: action space {env.action_space} is not gymnasium.spaces.Text"
        )
    return env


def check_config(section: EnvConfig) -> None:
    """Build and close the configured env once, so a bad id fails before anything starts (:func:`make`)."""
    if not section.gymnasium_env:
        raise ConfigError("env.gymnasium_env", "empty: name a registered id or an entry point module:Class")
    make(section.gymnasium_env, section.gymnasium_kwargs).close()
