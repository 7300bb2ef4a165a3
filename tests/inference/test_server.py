"""vLLM server lifecycle: the command line per device, start-up failures, and a stop that leaves no process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distrl_stream.config import InferenceConfig, ModelConfig
from distrl_stream.errors import ServerStartError
from distrl_stream.inference.server import InferenceServer


def _server(tmp_path: Path, device: str, **inference: object) -> InferenceServer:
    cfg = InferenceConfig(device=device, **inference)  # type: ignore[arg-type]
    return InferenceServer(tmp_path / "model", cfg, ModelConfig(policy_id="pi", lora_rank=16), tmp_path / "log")


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_cpu_command_follows_the_measured_cpu_recipe(tmp_path: Path) -> None:
    server = _server(tmp_path, "cpu", keep_versions=3, extra_args=["--seed", "7"])
    command = server.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(command, "--served-model-name") == "pi-v0"
    assert _flag(command, "--gpu-memory-utilization") == "0.2"
    assert _flag(command, "--max-lora-rank") == "16"
    assert _flag(command, "--max-loras") == "4"  # keep_versions + the one being loaded
    assert _flag(command, "--logprobs-mode") == "processed_logprobs"
    assert _flag(command, "--generation-config") == "vllm"
    assert "--enable-lora" in command
    assert command[-2:] == ["--seed", "7"]
    env = server.environment({})
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_gpu_command_uses_gpu_defaults(tmp_path: Path) -> None:
    server = _server(tmp_path, "gpu", gpu_memory_utilization=0.8)
    assert _flag(server.command(), "--gpu-memory-utilization") == "0.8"
    assert "VLLM_CPU_KVCACHE_SPACE" not in server.environment({})


def test_a_vision_model_is_served_with_one_image_per_prompt_and_a_text_model_without_the_limit(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path, "cpu")
    assert "--limit-mm-per-prompt" not in server.command()
    server.model_dir.mkdir()
    # What makes a folder a vision model's: a vision tower in its config.
    (server.model_dir / "config.json").write_text(json.dumps({"vision_config": {"image_size": 112}}))
    assert json.loads(_flag(server.command(), "--limit-mm-per-prompt")) == {"image": 1}


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue  # exited while we looked
    return pids


@pytest.mark.vllm
def test_server_that_is_not_ready_in_time_is_stopped_with_a_typed_error(tmp_path: Path) -> None:
    server = _server(tmp_path, "cpu", startup_timeout_s=1.0, port=0)
    with pytest.raises(ServerStartError, match="not ready") as info:
        server.start()
    assert "=== starting:" in info.value.log_tail
    assert not server.running()
    assert _processes_mentioning(str(tmp_path / "model")) == []


@pytest.mark.vllm
def test_server_that_exits_at_start_reports_the_log_tail_and_leaves_no_process(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()  # a folder that is not a model
    server = _server(tmp_path, "cpu", startup_timeout_s=120.0, port=0)
    with pytest.raises(ServerStartError, match="exited with code") as info:
        server.start()
    assert str(tmp_path / "model") in info.value.log_tail  # vLLM's own complaint names the folder
    assert "server log tail" in str(info.value)
    assert _processes_mentioning(str(tmp_path / "model")) == []


def test_stop_is_idempotent_and_safe_before_start(tmp_path: Path) -> None:
    server = _server(tmp_path, "cpu")
    server.stop()
    server.stop()
    assert not server.running()
