"""Who decides whether a task is complete: the environment itself (default) or an LLM judge over HTTP.

The simulator and MiniWoB++ know when a task is done; a real Android device does not. The DistRL paper asks a VLM
(Gemini) instead. :class:`LLMJudge` asks any OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted
API) a YES/NO question about the final screen, and :class:`JudgedEnv` wraps any environment so that its reward comes
from that verdict.

Failure mode: a judge that cannot answer (unreachable, HTTP error, timeout, an answer that is neither YES nor NO)
raises :class:`~distrl_stream.errors.JudgeError` naming the endpoint and the cause. It never guesses a verdict: a
collector records the episode as ended by an environment error and moves on.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Protocol

import httpx

from distrl_stream.config import mask_secrets, url_credentials
from distrl_stream.envs.actions import Status
from distrl_stream.envs.base import ActionInput, DeviceEnv, EnvKind, Observation, StepResult, Task
from distrl_stream.errors import EpisodeStateError, JudgeError

SYSTEM_PROMPT: Final = (
    "You check whether an agent operating a phone or web page has completed its task. "
    "Look at the task, the actions it took and the final screen. Answer with one word: YES or NO."
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judge's answer: complete or not, and the raw reply (for logs)."""

    success: bool
    reason: str


class Evaluator(Protocol):
    """Decides whether ``task`` is complete given the final observation and the actions taken."""

    async def evaluate(self, task: Task, observation: Observation, actions: Sequence[str]) -> Verdict:
        """The verdict for one episode state."""
        ...


class LLMJudge:
    """A YES/NO judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        url: base URL of the API, e.g. ``http://host:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the endpoint serves.
        api_key: bearer token, if the endpoint needs one.
        timeout_s: timeout of one request (connect + read).
        client: an existing httpx client to share (its lifetime stays the caller's).
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        # Requests go to the URL without its user:password, sent as basic auth; messages name the URL masked.
        self._endpoint, credentials = url_credentials(url.rstrip("/") + "/chat/completions")
        self._auth = httpx.BasicAuth(*credentials) if credentials else httpx.USE_CLIENT_DEFAULT
        self.url = mask_secrets(url.rstrip("/") + "/chat/completions")
        self.model = model
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self._headers = headers

    async def evaluate(self, task: Task, observation: Observation, actions: Sequence[str]) -> Verdict:
        """Ask the endpoint whether the task is complete.

        Raises:
            JudgeError: no usable verdict (unreachable, timeout, HTTP error, or a reply that is not YES/NO).
        """
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": self._user_content(task, observation, actions)},
            ],
            "temperature": 0,
            "max_tokens": 4,
        }
        try:
            response = await self._client.post(
                self._endpoint, json=body, headers=self._headers, auth=self._auth, timeout=self.timeout_s
            )
        except httpx.TimeoutException:
            raise JudgeError(f"judge {self.url} timed out after {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise JudgeError(f"judge {self.url} unreachable: {type(exc).__name__}: {mask_secrets(str(exc))}") from None
        if response.status_code >= 400:
            raise JudgeError(f"judge {self.url} answered HTTP {response.status_code}: {response.text[:200]}")
        return _parse_reply(self.url, response)

    async def aclose(self) -> None:
        """Close the HTTP client if this judge created it."""
        if self._owns_client:
            await self._client.aclose()

    @staticmethod
    def _user_content(task: Task, observation: Observation, actions: Sequence[str]) -> str | list[dict[str, Any]]:
        steps = "\n".join(f"{i}. {a}" for i, a in enumerate(actions, 1)) or "(none)"
        text = (
            f"Task: {observation.instruction or task.instruction}\n"
            f"Actions taken:\n{steps}\n"
            f"Final screen:\n{observation.screen}\n"
            "Is the task complete? Answer YES or NO."
        )
        if observation.screenshot is None:
            return text
        image = base64.b64encode(observation.screenshot).decode()
        return [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        ]


def _parse_reply(url: str, response: httpx.Response) -> Verdict:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeError(f"judge {url} sent no chat completion: {response.text[:200]}") from None
    if not isinstance(content, str):
        raise JudgeError(f"judge {url} sent a non-text reply: {str(content)[:200]}")
    words = content.strip().split()
    word = words[0].strip(".,!:;\"'").upper() if words else ""
    if word not in ("YES", "NO"):
        raise JudgeError(f"judge {url} answered neither YES nor NO: {content[:200]!r}")
    return Verdict(word == "YES", content.strip()[:200])


class JudgedEnv:
    """Any :class:`DeviceEnv` whose success and reward come from a judge instead of the environment's own check.

    With ``judge_on="status"`` the judge is asked when the agent declares ``status: complete``, when the
    environment ends the episode, and at the horizon; with ``"every_step"`` after every valid step (DigiRL's
    setting: an early success ends the episode there). The environment's own verdict stays in
    ``info.extra["env_success"]``, the judge's reply in ``info.extra["judge"]``.

    Args:
        env: the wrapped environment.
        judge: the evaluator.
        judge_on: when to ask (see above).
    """

    def __init__(self, env: DeviceEnv, judge: Evaluator, judge_on: Literal["status", "every_step"] = "status") -> None:
        self.env = env
        self.judge = judge
        self.judge_on = judge_on
        self.kind: EnvKind = env.kind
        self._task: Task | None = None
        self._actions: list[str] = []
        self._over = False

    async def reset(self, task: Task) -> Observation:
        """Reset the wrapped environment and forget the previous episode's actions."""
        observation = await self.env.reset(task)
        self._task, self._actions, self._over = task, [], False
        return observation

    async def step(self, action: ActionInput) -> StepResult:
        """Step the wrapped environment, then let the judge decide success where the policy says so."""
        if self._over:
            # The judge may end an episode the wrapped environment still considers running.
            raise EpisodeStateError(f"judged {self.kind}: step() after the episode ended; call reset()")
        result = await self.env.step(action)
        info = result.info
        self._actions.append(info.action_text)
        declared = isinstance(info.action, Status) and info.action.goal_status == "complete"
        ending = result.done or result.truncated
        if not (ending or declared or (self.judge_on == "every_step" and info.valid)):
            # The environment's own check does not count here: only the judge decides success.
            extra = {**info.extra, "env_success": info.success}
            return replace(result, reward=0.0, info=replace(info, success=False, extra=extra))
        assert self._task is not None  # the wrapped env raised already if there was no reset
        started = time.perf_counter()
        verdict = await self.judge.evaluate(self._task, result.observation, self._actions)
        extra = {
            **info.extra,
            "env_success": info.success,
            "judge": verdict.reason,
            "judge_latency_s": time.perf_counter() - started,
        }
        done = result.done or verdict.success
        self._over = done or result.truncated
        return StepResult(
            result.observation,
            1.0 if verdict.success else 0.0,
            done,
            result.truncated and not done,
            replace(info, success=verdict.success, extra=extra),
        )

    def candidates(self, observation: Observation) -> list[str]:
        """The wrapped environment's candidates."""
        return self.env.candidates(observation)

    async def close(self) -> None:
        """Close the wrapped environment and the judge's client."""
        await self.env.close()
        aclose = getattr(self.judge, "aclose", None)
        if aclose is not None:
            await aclose()
