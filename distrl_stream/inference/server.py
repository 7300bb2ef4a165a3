"""Lifecycle of the vLLM OpenAI-compatible policy server, run as a child process.

The server is started with LoRA enabled and runtime LoRA loading allowed (new policy versions are hot-loaded
through ``/v1/load_lora_adapter``), with ``--logprobs-mode processed_logprobs`` (the log-probs after temperature and
the structured-output mask: the behaviour policy μ the learner must reproduce), and with the model's own
generation defaults ignored (``--generation-config vllm``: a Qwen instruct model's top_p/top_k/repetition penalty
would otherwise change μ behind the learner's back). The base model is served as ``<policy_id>-v0``.
A vision-language model is served with at most one image per prompt (the step's screenshot).

The child is a :class:`~distrl_stream.processes.ChildProcess`: stopping it signals its whole process group, so vLLM's
engine-core and worker processes never outlive :meth:`InferenceServer.stop`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import httpx
from pydantic import SecretStr

from distrl_stream.config import Config, InferenceConfig, ModelConfig
from distrl_stream.errors import ServerStartError
from distrl_stream.inference.client import auth_headers, served_name
from distrl_stream.policy.model_dir import resolve_model_dir
from distrl_stream.policy.precision import resolve_precision
from distrl_stream.policy.vision import is_vision_model
from distrl_stream.processes import LOG_TAIL_LINES, ChildProcess, free_port, log_tail

log = logging.getLogger(__name__)

# vLLM on CPU reserves 92% of RAM for the KV cache unless told otherwise (docs/design.md §8).
_CPU_MEMORY_UTILIZATION = "0.2"


def unload_all_adapters(server_url: str, timeout_s: float = 60.0, api_key: SecretStr | None = None) -> None:
    """Unload every LoRA adapter a running server holds, leaving only the base model served."""
    with httpx.Client(base_url=server_url, timeout=timeout_s, headers=auth_headers(api_key)) as client:
        for item in client.get("/v1/models").json()["data"]:
            if item.get("parent"):
                client.post("/v1/unload_lora_adapter", json={"lora_name": item["id"]}).raise_for_status()


def start_on_cores(server: InferenceServer, cores: set[int], fallback: set[int] | None = None) -> list[int]:
    """Start ``server`` with this process, whose CPU affinity it inherits, allowed ``cores``; returns the cores it
    started on.

    vLLM on CPU binds its compute threads when it starts, to the cores it may use less one kept for its scheduler, so
    the affinity at start decides how many cores it computes on for its whole life. If it does not start on ``cores``
    and a ``fallback`` is given, it is started there instead (the affinity stays at what it started on).

    Raises:
        ServerStartError: it did not start (on ``fallback`` either, when given).
    """
    os.sched_setaffinity(0, cores)
    try:
        server.start()
    except ServerStartError:
        if fallback is None:
            raise
        log.exception("the vLLM server did not start on cores %s; starting it on %s", sorted(cores), sorted(fallback))
        os.sched_setaffinity(0, fallback)
        server.start()
    return sorted(os.sched_getaffinity(0))


def cuda_available() -> bool:
    """Whether this machine can run vLLM's GPU build (CUDA visible to torch)."""
    import torch

    return torch.cuda.is_available()


class InferenceServer:
    """A vLLM OpenAI server on one base model.

    Use as a context manager (``with InferenceServer(...) as server:``) or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        model_dir: Path,
        inference: InferenceConfig,
        model: ModelConfig,
        log_path: Path,
        *,
        python: str = sys.executable,
    ) -> None:
        """Args:
        model_dir: the base model folder.
        inference: server settings (host, port, device, dtype, ...).
        model: policy id and LoRA shape (``--max-lora-rank``).
        log_path: file the server's stdout and stderr are appended to.
        python: interpreter that runs vLLM (the one with vllm installed).
        """
        self.model_dir = model_dir
        self.inference = inference
        self.model = model
        self.log_path = log_path
        self.python = python
        self.host = inference.host
        self.port = inference.port
        self.device = "gpu" if inference.device == "gpu" or (inference.device == "auto" and cuda_available()) else "cpu"
        # vLLM's own `auto` would mean the checkpoint's dtype; ours is the hardware's (bf16 where it is native).
        self.dtype = (
            resolve_precision(inference.dtype, self.device, role="inference")
            if inference.dtype == "auto"
            else inference.dtype
        )
        self._process: ChildProcess | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> InferenceServer:
        """A server for ``cfg``: its base model (built if needed), settings and log file."""
        log_path = cfg.inference.log_file or cfg.run_dir / "logs" / "vllm.log"
        return cls(resolve_model_dir(cfg), cfg.inference, cfg.model, log_path)

    @property
    def url(self) -> str:
        """Base URL of the server (``http://host:port``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_name(self) -> str:
        """Served name of the base model (version 0)."""
        return served_name(self.model.policy_id, 0)

    @property
    def pid(self) -> int | None:
        """Process id of the server (also its process-group id), or None when not running."""
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        """The server's command line."""
        inf = self.inference
        # Every version kept, plus the one being loaded before the oldest is retired, fits at once.
        max_loras = str(inf.keep_versions + 1)
        args = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.base_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(inf.max_model_len),
            "--enable-lora",
            "--max-lora-rank",
            str(self.model.lora_rank),
            "--max-loras",
            max_loras,
            "--max-cpu-loras",
            max_loras,
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
            "--gpu-memory-utilization",
            _CPU_MEMORY_UTILIZATION if self.device == "cpu" else str(inf.gpu_memory_utilization),
        ]
        if is_vision_model(self.model_dir):
            # One screenshot per prompt, the step's: vLLM refuses a request with more.
            args += ["--limit-mm-per-prompt", json.dumps({"image": 1})]
        return args + list(inf.extra_args)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment: ``base`` (default: ours) plus the settings vLLM reads from the environment."""
        env = dict(os.environ if base is None else base)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # The model is a local folder; never wait on (or leak requests to) the hub.
        env["HF_HUB_OFFLINE"] = "1"
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.inference.cpu_kvcache_gb)
        # vLLM reads its key from here as from --api-key; unlike an argument it does not show in `ps`. Without
        # inference.api_key no key from our own environment may slip through, or our clients would be refused.
        env.pop("VLLM_API_KEY", None)
        if self.inference.api_key is not None:
            env["VLLM_API_KEY"] = self.inference.api_key.get_secret_value()
        return env

    def start(self) -> None:
        """Start the server and wait until it answers ``/v1/models`` with the base model.

        Raises:
            ServerStartError: the process exited or did not become ready within ``startup_timeout_s``; the
                message ends with the tail of the log. The process group is stopped before raising.
        """
        if self._process is not None:
            raise ServerStartError(f"server already started (pid {self._process.pid})")
        if self.port == 0:
            self.port = free_port(self.host)
        self._process = ChildProcess("vLLM server", self.command(), self.environment(), self.log_path)
        self._process.start()
        log.info(
            "vLLM server pid %d on %s (device %s), log %s", self._process.pid, self.url, self.device, self.log_path
        )
        try:
            wait_ready(
                self.url, self.base_name, self._process, self.inference.startup_timeout_s, self.inference.api_key
            )
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.running()

    @property
    def returncode(self) -> int | None:
        """The server's exit code once it ended (negative: killed by that signal), else None."""
        return self._process.returncode if self._process is not None else None

    def stop(self) -> None:
        """SIGTERM the process group, wait ``stop_timeout_s``, then SIGKILL whatever is left. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(self.inference.stop_timeout_s)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        return log_tail(self.log_path, lines)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_ready(
    url: str, model_name: str, process: ChildProcess, timeout_s: float, api_key: SecretStr | None = None
) -> None:
    """Poll ``url``'s ``/v1/models`` until it lists ``model_name``, ``process`` exits, or ``timeout_s`` passes.

    Args:
        url: the server's base URL.
        model_name: the served name to wait for (the base model's).
        process: the process that serves it (a vLLM server, or ``distrl-stream serve`` under ``up``).
        timeout_s: how long to wait.
        api_key: the server's key (``inference.api_key``), if it has one.

    Raises:
        ServerStartError: with the tail of the process's log.
    """
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, headers=auth_headers(api_key)) as client:
        while True:
            if not process.running():
                raise ServerStartError(
                    f"{process.name} exited with code {process.returncode} while starting (log: {process.log_path})",
                    process.log_tail(),
                )
            try:
                response = client.get(f"{url}/v1/models")
                if response.status_code == 200 and any(
                    m.get("id") == model_name for m in response.json().get("data", [])
                ):
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{process.name} not ready on {url} after {timeout_s:.0f}s (log: {process.log_path})",
                    process.log_tail(),
                )
            time.sleep(0.5)
