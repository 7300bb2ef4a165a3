"""Ports handed to child processes (``processes.free_port``) and how a failed one is described (``log_report``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from distrl_stream import processes
from distrl_stream.processes import free_port, log_report


def test_a_handed_port_is_free_and_outside_the_ephemeral_range() -> None:
    low, high = processes._ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert all(not low <= port <= high and port >= 10000 for port in ports), (ports, low, high)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_already_bound_is_never_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        # Every candidate is the busy port: the search gives up and lets the OS pick.
        monkeypatch.setattr(processes._PORT_RNG, "choice", lambda _ports: busy)
        assert free_port() != busy


def test_no_port_outside_the_ephemeral_range_falls_back_to_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_ephemeral_range", lambda: (1024, 65535))
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_the_first_error_of_a_report_is_not_a_warning_that_names_one(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=1) WARNING 12-03 22:05:27 [system_utils.py:255] Found ulimit of 20000 ... like "
        "`OSError: [Errno 24] Too many open files`\n"
        "(APIServer pid=1) ERROR 12-03 22:07:53 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue.\n"
        "shutdown noise\n"
    )
    report = log_report(log)
    assert "first error: (APIServer pid=1) ERROR" in report and "EngineDeadError: EngineCore" in report


def test_the_first_error_of_a_report_is_the_last_starts(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "=== starting: vllm (at 22:05)\nRuntimeError: the first crash\n"
        "=== starting: vllm (at 22:08)\nTimeoutError: the second crash\n"
    )
    assert "first error: TimeoutError: the second crash" in log_report(log)
