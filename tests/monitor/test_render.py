"""Monitor rendering: the plain-text snapshot and the rich dashboard."""

from __future__ import annotations

import io

from rich.console import Console

from distrl_stream.monitor.render import dashboard, plain
from distrl_stream.monitor.state import MonitorState
from tests.monitor.test_state import _at, _collector, _learner, _server


def _state() -> MonitorState:
    state = MonitorState("r", windows_s=(60.0,))
    for k in range(7):
        state.add(_collector(10 * k, "collector-0", 2 * k, k, policy_version=1, inference_latency_p50_s=0.12))
    state.add(_learner(60, version=2, updates=40, updates_per_s=0.5, loss_policy=0.25, entropy=1.5))
    state.add(_server(50, "gpu-0:8000", "loaded", policy_version=2))
    state.add(_server(55, "gpu-1:8000", "loaded", policy_version=1))
    state.set_kafka(consumer_lag=3, dlq_records=0)
    return state


def test_plain_snapshot_states_throughput_success_versions_and_collectors() -> None:
    text = plain(_state().snapshot(_at(60)))
    assert "throughput (1 min): 12.00 trajectories/min, success 50% of 12 episodes" in text
    assert "learner v2" in text and "learner group lag 3 records" in text and "DLQ 0" in text
    assert "collector-0 running: 12 episodes" in text and "inference p50 120 ms" in text
    assert "loss_policy 0.25" in text
    assert "gpu-0:8000: serves v2, 0 behind the learner" in text
    assert "gpu-1:8000: serves v1, 1 behind the learner, last loaded at 12:00:55" in text


def test_dashboard_renders_every_panel() -> None:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(dashboard(_state().snapshot(_at(60))))
    text = out.getvalue()
    for expected in ("run r ", "learner", "collectors (1)", "collector-0", "12.00", "running", "policy servers (2)"):
        assert expected in text


def test_an_empty_run_renders_without_numbers() -> None:
    snap = MonitorState("empty").snapshot(_at(0))
    assert "0.00 trajectories/min" in plain(snap)
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(dashboard(snap))
    assert "no collector metrics yet" in out.getvalue()
