"""Lifecycle of the vLLM OpenAI-compatible policy server, run as a child process.

The server is started with LoRA enabled and runtime LoRA loading allowed (new policy versions are hot-loaded
through ``/v1/load_lora_adapter``), with ``--logprobs-mode processed_logprobs`` (the log-probs after temperature and
the structured-output mask: the behaviour policy μ the learner must reproduce), and with the model's own
generation defaults ignored (``--generation-config vllm``: a Qwen instruct model's top_p/top_k/repetition penalty
would otherwise change μ behind the learner's back). The base model is served as ``<policy_id>-v0``.

The child runs in its own session, so stopping it signals the whole process group: vLLM's engine-core and worker
processes never outlive :meth:`InferenceServer.stop`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Self

import httpx

from distrl_stream.config import Config, InferenceConfig, ModelConfig
from distrl_stream.errors import ServerStartError
from distrl_stream.inference.client import served_name
from distrl_stream.policy.model_dir import resolve_model_dir
from distrl_stream.processes import free_port, signal_group

log = logging.getLogger(__name__)

# vLLM on CPU reserves 92% of RAM for the KV cache unless told otherwise (docs/design.md §8).
_CPU_MEMORY_UTILIZATION = "0.2"
_LOG_TAIL_LINES = 40


def unload_all_adapters(server_url: str, timeout_s: float = 60.0) -> None:
    """Unload every LoRA adapter a running server holds, leaving only the base model served."""
    with httpx.Client(base_url=server_url, timeout=timeout_s) as client:
        for item in client.get("/v1/models").json()["data"]:
            if item.get("parent"):
                client.post("/v1/unload_lora_adapter", json={"lora_name": item["id"]}).raise_for_status()


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
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None

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
        return self._proc.pid if self._proc is not None else None

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
            inf.dtype,
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
        return args + list(inf.extra_args)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment: ``base`` (default: ours) plus the settings vLLM reads from the environment."""
        env = dict(os.environ if base is None else base)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # The model is a local folder; never wait on (or leak requests to) the hub.
        env["HF_HUB_OFFLINE"] = "1"
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.inference.cpu_kvcache_gb)
        return env

    def start(self) -> None:
        """Start the server and wait until it answers ``/v1/models`` with the base model.

        Raises:
            ServerStartError: the process exited or did not become ready within ``startup_timeout_s``; the
                message ends with the tail of the log. The process group is stopped before raising.
        """
        if self._proc is not None:
            raise ServerStartError(f"server already started (pid {self._proc.pid})")
        if self.port == 0:
            self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = self.log_path.open("ab")
        self._log_fh.write(f"\n=== starting: {' '.join(self.command())}\n".encode())
        self._log_fh.flush()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            # Own session = own process group: stop() signals vLLM's engine and worker processes too.
            start_new_session=True,
        )
        log.info("vLLM server pid %d on %s (device %s), log %s", self._proc.pid, self.url, self.device, self.log_path)
        try:
            self.wait_ready(self.inference.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/v1/models`` until it lists the base model, the process dies, or ``timeout_s`` passes.

        Raises:
            ServerStartError: with the log tail.
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    raise ServerStartError(
                        f"vLLM server exited with code {self._proc.returncode} while starting (log: {self.log_path})",
                        self.log_tail(),
                    )
                try:
                    response = client.get(f"{self.url}/v1/models")
                    if response.status_code == 200 and any(
                        m.get("id") == self.base_name for m in response.json().get("data", [])
                    ):
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    raise ServerStartError(
                        f"vLLM server not ready on {self.url} after {timeout_s:.0f}s (log: {self.log_path})",
                        self.log_tail(),
                    )
                time.sleep(0.5)

    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the process group, wait ``stop_timeout_s``, then SIGKILL whatever is left. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.inference.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "vLLM server %d ignored SIGTERM for %.0fs; killing it", proc.pid, self.inference.stop_timeout_s
                )
            # The leader may be gone while engine/worker children linger: kill the whole group regardless.
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(fh.tell() - 64 * 1024, 0))
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
