"""The shared Prometheus registry and endpoint (each role's metrics are tested beside the role), and TensorBoard."""

from __future__ import annotations

import ast
import socket
import sys
from pathlib import Path

import httpx
import pytest

import distrl_stream.monitor
from distrl_stream.errors import ConfigError
from distrl_stream.monitor.prometheus import RoleMetrics
from distrl_stream.monitor.tensorboard import scalar_writer
from tests.monitor.scrape import serve


def test_a_busy_port_is_one_line_naming_the_field() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        metrics = RoleMetrics("r1", "collector", "c")
        with pytest.raises(ConfigError, match=r"^collector\.metrics_port: cannot serve metrics on port \d+") as info:
            metrics.serve(busy.getsockname()[1], "collector.metrics_port")
    assert "\n" not in str(info.value)


def test_close_stops_serving_and_none_serves_nothing(served: list[RoleMetrics]) -> None:
    metrics = RoleMetrics("r1", "collector", "c")
    assert metrics.serve(None, "collector.metrics_port") is None and metrics.port is None
    address = serve(metrics, served)
    metrics.close()
    metrics.close()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{address}/metrics", timeout=5.0)


def test_tensorboard_dir_without_the_package_is_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ConfigError, match=r"^learner\.tensorboard_dir: needs the tensorboard package"):
        scalar_writer(tmp_path / "tb", "learner.tensorboard_dir")


def test_tensorboard_scalars_are_written_at_the_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = scalar_writer(tmp_path / "tb", "learner.tensorboard_dir")
    writer.add_scalars({"loss_policy": 0.5}, 3)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("learner/loss_policy")] == [(3, 0.5)]


def test_the_monitor_package_imports_no_role() -> None:
    """Roles import the shared registry; a role's metrics live with the role, so the monitor never imports one back
    (not even for type checking)."""
    roles = ("distrl_stream.collector", "distrl_stream.learner", "distrl_stream.inference", "distrl_stream.orchestrate")
    monitor = Path(distrl_stream.monitor.__file__).parent
    found = []
    for path in sorted(monitor.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.name}: {name}" for name in names if name.startswith(roles)]
    assert found == []
