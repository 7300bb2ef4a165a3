"""The policy server's API key: handed to vLLM out of sight of `ps`, sent by every client, never printed."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import InferenceConfig, ModelConfig, load_config
from distrl_stream.errors import InferenceRequestError
from distrl_stream.inference.client import InferenceClient, auth_headers
from distrl_stream.inference.server import InferenceServer, unload_all_adapters
from distrl_stream.policy.prompt import build_prompt

KEY = "sk-test-5f0c2e9d"  # distinctive, so a test can search output for it


def _server(tmp_path: Path, model_dir: Path, **inference: object) -> InferenceServer:
    cfg = InferenceConfig(device="cpu", **inference)  # type: ignore[arg-type]
    return InferenceServer(model_dir, cfg, ModelConfig(), tmp_path / "vllm.log")


def test_the_key_reaches_vllm_through_its_environment_not_its_command_line(tmp_path: Path) -> None:
    server = _server(tmp_path, tmp_path / "model", api_key=KEY)
    assert server.environment({})["VLLM_API_KEY"] == KEY
    assert KEY not in " ".join(server.command())


def test_without_a_key_an_inherited_vllm_api_key_is_not_passed_on(tmp_path: Path) -> None:
    # Our clients would not send it, so a server that required it would refuse the whole run.
    server = _server(tmp_path, tmp_path / "model")
    assert "VLLM_API_KEY" not in server.environment({"VLLM_API_KEY": "leftover"})


def test_clients_send_the_key_as_a_bearer_token() -> None:
    assert auth_headers(SecretStr(KEY)) == {"Authorization": f"Bearer {KEY}"}
    assert auth_headers(None) == {}
    client = InferenceClient(InferenceConfig(api_key=KEY, urls=["http://gpu-0:8000", "http://gpu-1:8000"]))
    assert [s.http.headers["Authorization"] for s in client.servers] == [f"Bearer {KEY}"] * 2


def test_the_key_comes_from_the_environment_and_config_show_masks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRL_INFERENCE__API_KEY", KEY)
    cfg = load_config()
    assert cfg.inference.api_key is not None and cfg.inference.api_key.get_secret_value() == KEY
    assert KEY not in repr(cfg)
    shown = CliRunner().invoke(app, ["config", "show"])
    assert shown.exit_code == 0, shown.output
    assert KEY not in shown.output
    assert json.loads(shown.output)["inference"]["api_key"] == "**********"


@pytest.mark.vllm
async def test_a_server_with_a_key_refuses_requests_without_it_and_serves_clients_that_send_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # start() itself proves the readiness check sends the key: without it /v1/models answers 401 until the timeout.
    server = _server(tmp_path, tiny_model_dir, port=0, api_key=KEY, request_timeout_s=20.0, startup_timeout_s=240.0)
    with server:
        assert httpx.get(f"{server.url}/v1/models", timeout=10.0).status_code == 401
        keyed = server.inference.model_copy(update={"port": server.port})
        async with InferenceClient(keyed, "policy") as client:
            result = await client.act(build_prompt("Click the OK button.", "[0] button 'OK'"), ["click(0)", "back()"])
        assert result.text in ("click(0)", "back()") and result.version == 0
        unload_all_adapters(server.url, timeout_s=30.0, api_key=keyed.api_key)  # the GET it starts with is guarded
        async with InferenceClient(keyed.model_copy(update={"api_key": None}), "policy") as client:
            with pytest.raises(InferenceRequestError, match=r"inference\.api_key") as refused:
                await client.refresh_versions()
        assert refused.value.status_code == 401
        assert server._process is not None
        assert KEY.encode() not in Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert KEY not in server.log_path.read_text()
