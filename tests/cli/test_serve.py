"""`distrl-stream serve`'s supervision of its vLLM: how many restarts, what it says, when it gives up.

A stand-in for the server process keeps these fast; vLLM itself dying and coming back under `serve` is
tests/test_multihost.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.inference import server as server_module

runner = CliRunner()
Served = Callable[[int, int], tuple["ServerThatDies", str, int]]  # deaths, restarts -> the server, output, exit code


class ServerThatDies:
    """Stands in for :class:`InferenceServer`: the first ``deaths`` starts exit at once (code 0, as vLLM's API server
    does when its engine died), the next one runs until ``polls`` checks, then the user presses Ctrl-C."""

    def __init__(self, log_path: Path, deaths: int, polls: int = 2) -> None:
        self.log_path, self.deaths, self.polls = log_path, deaths, polls
        self.device, self.base_name, self.url = "cpu", "policy-v0", "http://127.0.0.1:1"
        self.model_dir = log_path.parent
        self.starts, self.stops, self.returncode = 0, 0, 0

    def start(self) -> None:
        self.starts += 1
        with self.log_path.open("a") as log:
            log.write(f"=== starting: vllm (start {self.starts})\nvllm.EngineDeadError: engine {self.starts} died\n")

    def running(self) -> bool:
        if self.starts <= self.deaths:
            return False
        self.polls -= 1
        if self.polls < 0:
            raise KeyboardInterrupt
        return True

    def stop(self) -> None:
        self.stops += 1


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Served:
    def serve(deaths: int, restarts: int) -> tuple[ServerThatDies, str, int]:
        fake = ServerThatDies(tmp_path / "vllm.log", deaths)
        monkeypatch.setattr(server_module.InferenceServer, "from_config", classmethod(lambda cls, cfg: fake))
        monkeypatch.setenv("DISTRL_INFERENCE__RESTARTS", str(restarts))
        result = runner.invoke(app, ["serve", "--no-watch", "--data-dir", str(tmp_path)])
        return fake, result.output, result.exit_code

    return serve


def test_a_vllm_that_dies_is_restarted_and_serves_again(served: Served) -> None:
    fake, output, code = served(deaths=2, restarts=3)
    assert code == 0, output
    assert fake.starts == 3
    assert "restarting it (1 of 3)" in output and "restarting it (2 of 3)" in output
    assert "first error: vllm.EngineDeadError: engine 2 died" in output  # each report names its own start's cause
    assert output.count("serving policy-v0 again") == 2
    assert "server stopped" in output


def test_serve_gives_up_once_its_restarts_are_spent(served: Served) -> None:
    fake, output, code = served(deaths=5, restarts=2)
    assert code == 1, output
    assert fake.starts == 3  # the first start and two restarts
    assert "exited unexpectedly with code 0 after 2 restarts (inference.restarts = 2)" in output
    assert "server stopped" in output


def test_no_restart_at_all_with_restarts_0(served: Served) -> None:
    fake, output, code = served(deaths=1, restarts=0)
    assert code == 1 and fake.starts == 1, output
    assert "after 0 restarts (inference.restarts = 0)" in output
