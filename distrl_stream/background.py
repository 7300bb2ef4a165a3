"""A daemon thread that follows a topic until stopped, for roles that watch Kafka beside their main loop."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class BackgroundFollower:
    """Runs :meth:`_follow` in a daemon thread until :meth:`stop`.

    ``_follow`` loops while ``self._stop`` is not set and closes its own clients. An exception ends the thread and is
    kept in :attr:`failed` (with a logged traceback), so the owner decides whether it is fatal.
    """

    thread_name = "follower"

    def __init__(self) -> None:
        self.failed: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start following in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to stop and wait for it (up to ``timeout_s``; past it the thread is left to end at its next
        check of the stop flag, and the owner must keep it from doing harm meanwhile)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning(
                    "%s still busy %.1f s after being asked to stop: left to end on its own",
                    self.thread_name,
                    timeout_s,
                )
            self._thread = None

    def _run(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # reported through `failed`
            log.exception("%s failed", self.thread_name)
            self.failed = exc

    def _follow(self) -> None:
        raise NotImplementedError
