"""The weight watcher's Prometheus metrics: what the server serves (docs/monitor.md lists them)."""

from __future__ import annotations

from collections.abc import Callable

from distrl_stream.monitor.prometheus import EPISODE_BUCKETS, RoleMetrics


class WatcherMetrics(RoleMetrics):
    """The weight watcher's metrics (what the server serves).

    Args:
        run: the run.
        server: names the server (the watcher's source id).
        served_version: the newest version loaded (0 = the base model).
        published_version: the newest version of the policy seen on ``{run}.weights``.
        loaded_versions: adapter versions loaded now.
        refused: versions refused so far.
    """

    def __init__(
        self,
        run: str,
        server: str,
        *,
        served_version: Callable[[], int],
        published_version: Callable[[], int],
        loaded_versions: Callable[[], int],
        refused: Callable[[], int],
    ) -> None:
        super().__init__(run, "inference", server)
        self.loads = 0
        p = "distrl_inference"
        self.gauge(
            f"{p}_served_version", "Newest policy version the server serves (0: the base model).", served_version
        )
        self.gauge(
            f"{p}_published_version", "Newest version of the policy published on {run}.weights.", published_version
        )
        self.gauge(
            f"{p}_version_lag",
            "Versions the served version is behind the newest published.",
            lambda: max(published_version() - served_version(), 0),
        )
        self.gauge(f"{p}_loaded_versions", "Adapter versions loaded now (at most keep_versions).", loaded_versions)
        self.counter(f"{p}_version_loads", "Versions verified and loaded.", lambda: self.loads)
        self.counter(f"{p}_versions_refused", "Versions refused (bad checksum, missing, server error).", refused)
        self.load_duration = self.histogram(
            f"{p}_adapter_load_seconds", "Copy, verify and load of one version.", EPISODE_BUCKETS
        )

    def loaded(self, load_s: float) -> None:
        """Count one version loaded in ``load_s`` seconds."""
        self.loads += 1
        self.load_duration.observe(load_s)
