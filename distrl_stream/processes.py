"""Child processes and local ports: what the broker, the vLLM server and `up` share to never leave orphans behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
    """For ``preexec_fn``: ask Linux to SIGTERM the child when its parent dies, so no JVM or server is orphaned."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def signal_group(pgid: int | None, sig: signal.Signals) -> None:
    """Send ``sig`` to a whole process group (children started with ``start_new_session``); gone is fine."""
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
