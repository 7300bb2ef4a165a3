"""Child processes and local ports: what the broker, the vLLM server and `up` share to never leave orphans behind."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40


# Ports handed to another process are drawn below the kernel's ephemeral range: a port from that range (bind to 0)
# can be taken by any process's outgoing connection or bind(0) before its new owner binds it, and vLLM alone binds
# several while it starts (a child's metrics port was lost that way); below the range only an explicit bind competes.
_LOWEST_HANDED_PORT = 10000
_DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# The OS's entropy, not the global generator: a process that seeds `random` must not hand out a predictable sequence.
_PORT_RNG = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL_RANGE


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port, free a moment ago, for another process to bind: outside the ephemeral range when one is free."""
    low, high = _ephemeral_range()
    handed = max(range(_LOWEST_HANDED_PORT, low), range(high + 1, 65536), key=len)
    for _ in range(200 if handed else 0):
        port = _PORT_RNG.choice(handed)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, contextlib.suppress(OSError):
            sock.bind((host, port))
            return port
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


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """For ``preexec_fn`` (or a child's first step): ask Linux to send ``sig`` to this process when its parent dies,
    so no JVM, server or learner member is orphaned."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # 1 = PR_SET_PDEATHSIG


def signal_group(pgid: int | None, sig: signal.Signals) -> None:
    """Send ``sig`` to a whole process group (children started with ``start_new_session``); gone is fine."""
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)


START_HEADER = "=== starting:"  # the line a ChildProcess writes to its log at each start
_EXCEPTION_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")


def _log_end(path: Path, window_bytes: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - window_bytes, 0))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    return "\n".join(_log_end(path, 64 * 1024).splitlines()[-lines:])


def log_report(path: Path) -> str:
    """How a failed process is described: ``(log PATH)``, the first line near the log's end that names an exception
    (``SomeError: why``) if any, then the log's tail.

    A process that dies of an error usually logs its cause first and then pages of shutdown noise, so the tail alone
    rarely shows why (vLLM's engine, for one).
    """
    lines = _log_end(path, 256 * 1024).splitlines()
    # A log appended to by several starts (`serve` restarting vLLM): the cause is in the last one's part.
    starts = [i for i, line in enumerate(lines) if line.startswith(START_HEADER)]
    if starts:
        lines = lines[starts[-1] :]
    # A warning that merely names an error (vLLM's about `OSError: [Errno 24]` at every start) is not the cause.
    cause = next((line.strip() for line in lines if _EXCEPTION_LINE.search(line) and " WARNING " not in line), None)
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    return f"(log {path})" + (f"; first error: {cause}" if cause else "") + f":\n{tail}"


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc; empty where /proc is not available)."""
    children: dict[int, list[int]] = defaultdict(list)
    proc = Path("/proc")
    if not proc.is_dir():
        return set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may contain spaces and parentheses: parse after its closing one.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class ChildProcess:
    """A command run as a child in a process group of its own, its stdout and stderr appended to a log file.

    Stopping it signals the whole group, then kills any descendant that left the group (vLLM's engine runs in a
    session of its own under ``serve``). Unless detached, the child gets Linux's parent-death signal, so even a
    SIGKILL of this process sends it SIGTERM; Linux sends it when the *thread* that started the child ends, so start
    children from a thread that lives as long as they should (the main thread everywhere today).

    Args:
        name: what logs and messages call it (``serve``, ``collector-0``, ``kafka``...).
        argv: the command line.
        env: its environment (None: ours).
        log_path: where its output goes (appended, after a header line with the command).
        cwd: its working directory (None: ours).
        detach: let it outlive this process (no parent-death signal).
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None,
        log_path: Path,
        *,
        cwd: Path | None = None,
        detach: bool = False,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self.detach = detach
        self.stopping = False
        self._family: set[int] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        """Start the process in a session of its own (so no terminal signal such as Ctrl-C reaches it)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n{START_HEADER} {' '.join(self.argv)} (at {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if self.detach else die_with_parent,
        )

    @property
    def pid(self) -> int | None:
        """Process id (also its process group id), None before :meth:`start`."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit code once it ended (negative: killed by that signal), else None."""
        return self._proc.poll() if self._proc is not None else None

    def running(self) -> bool:
        """Whether it was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def terminate(self) -> None:
        """Send SIGTERM to its process group once (a second signal means "hurry" to some roles: never repeat it)."""
        if self._proc is None or self.stopping:
            return
        self.stopping = True
        if self._proc.poll() is None:
            # The tree is read first: a descendant in a session of its own is reparented once its parent exits.
            self._family = descendants(self._proc.pid)
            signal_group(self._proc.pid, signal.SIGTERM)

    def stop(self, grace_s: float) -> int | None:
        """:meth:`terminate`, wait up to ``grace_s``, then SIGKILL the group and every descendant seen.

        Returns:
            The exit code (None if it was never started).
        """
        if self._proc is None:
            return None
        self.terminate()
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", self.name, self._proc.pid, grace_s)
                self._family |= descendants(self._proc.pid)
        # The leader may be gone while children linger in its group: kill the group regardless.
        signal_group(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        _kill_all(self._family)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self._proc.returncode

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log."""
        return log_tail(self.log_path, lines)
