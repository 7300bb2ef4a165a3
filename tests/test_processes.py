"""Ports handed to child processes (``processes.free_port``)."""

from __future__ import annotations

import socket

import pytest

from distrl_stream import processes
from distrl_stream.processes import free_port


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
