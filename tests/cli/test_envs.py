"""`distrl-stream envs miniwob-check`: the suite check from the command line."""

from __future__ import annotations

import subprocess

import pytest


def run_cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["distrl-stream", *args], capture_output=True, text=True, timeout=timeout_s, check=False)


def test_an_unknown_task_is_one_line_naming_the_option() -> None:
    result = run_cli("envs", "miniwob-check", "--task", "no-such-task")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "--task" in result.stderr and "no-such-task" in result.stderr


@pytest.mark.browser
def test_the_check_solves_a_simple_task_and_writes_the_table(tmp_path) -> None:
    table = tmp_path / "support.md"
    result = run_cli("envs", "miniwob-check", "--task", "click-button", "--budget-s", "20", "--markdown", str(table))
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("| click-button |"))
    assert "| yes |" in row
    assert "1 of 1 tasks reachable" in result.stdout
    assert table.read_text().splitlines()[2] == row
