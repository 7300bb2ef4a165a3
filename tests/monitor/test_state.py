"""Monitor aggregation: rolling windows from cumulative counters, collector rows, versions and lag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from distrl_stream.events import MetricEvent
from distrl_stream.monitor.state import MonitorState

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _collector(t: float, source: str, total: float, success: float, *, run: str = "r", **values: float) -> MetricEvent:
    return MetricEvent(
        run=run,
        role="collector",
        source_id=source,
        timestamp=_at(t),
        values={"episodes_total": total, "episodes_success": success, **values},
        labels={},
    )


def _fields(event: MetricEvent) -> dict[str, object]:
    return {name: getattr(event, name) for name in event.__slots__}


def _learner(t: float, **values: float) -> MetricEvent:
    return MetricEvent(run="r", role="learner", source_id="learner-0", timestamp=_at(t), values=values, labels={})


def _server(t: float, source: str, event: str, **values: float) -> MetricEvent:
    return MetricEvent(
        run="r", role="inference", source_id=source, timestamp=_at(t), values=values, labels={"event": event}
    )


def test_window_rate_is_the_counter_increase_over_the_window() -> None:
    state = MonitorState("r", windows_s=(60.0, 300.0))
    # Two collectors, each finishing 1 episode per 10 s (6/min), one of them succeeding half the time.
    for k in range(31):
        state.add(_collector(10 * k, "a", k, k // 2))
        state.add(_collector(10 * k, "b", k, 0))
    snap = state.snapshot(_at(300))
    short, long = snap.windows
    assert short.per_min == pytest.approx(12.0)
    assert long.per_min == pytest.approx(12.0)
    assert short.success == pytest.approx(3 / 12, abs=0.05)
    assert snap.episodes_total == 60


def test_a_run_younger_than_the_window_is_measured_over_its_age() -> None:
    state = MonitorState("r", windows_s=(300.0,))
    state.add(_collector(0, "a", 0, 0))
    state.add(_collector(60, "a", 10, 5))
    assert state.snapshot(_at(60)).per_min == pytest.approx(10.0)


def test_uptime_places_the_counters_origin_so_a_first_report_is_not_a_burst() -> None:
    state = MonitorState("r", windows_s=(60.0,))
    # First report seen after 600 s of work: 100 episodes over 10 minutes, not 100 in the last minute.
    state.add(_collector(600, "a", 100, 50, uptime_s=600))
    assert state.snapshot(_at(600)).per_min == pytest.approx(10.0)


def test_a_collector_restart_continues_its_counter() -> None:
    state = MonitorState("r", windows_s=(60.0,))
    state.add(_collector(0, "a", 50, 10))
    state.add(_collector(30, "a", 60, 12))
    state.add(_collector(60, "a", 5, 1))  # restarted under the same id: counts from 0 again
    snap = state.snapshot(_at(60))
    assert snap.episodes_total == 65
    assert snap.windows[0].episodes == pytest.approx(15.0)


def test_collector_rows_show_status_version_and_latency() -> None:
    state = MonitorState("r", windows_s=(60.0,))
    state.add(_collector(0, "a", 0, 0, policy_version=1, in_flight=4, paused=0, inference_latency_p50_s=0.1))
    state.add(_collector(10, "a", 2, 1, policy_version=2, in_flight=3, paused=1, inference_latency_p50_s=0.2))
    state.add(_collector(0, "b", 0, 0, policy_version=1))
    stopped = _collector(5, "c", 1, 1, policy_version=1)
    state.add(MetricEvent(**{**_fields(stopped), "labels": {"event": "final"}}))
    rows = {r.source_id: r for r in state.snapshot(_at(40)).collectors}
    assert rows["a"].status == "paused" and rows["a"].policy_version == 2 and rows["a"].in_flight == 3
    assert rows["a"].inference_p50_s == 0.2 and rows["a"].success == pytest.approx(0.5)
    assert rows["b"].status == "stale"  # silent for 40 s, more than 30 s and 3 intervals
    assert rows["c"].status == "stopped"
    assert state.snapshot(_at(40)).acting_versions == {1: 1, 2: 1}  # stopped collectors do not act


def test_learner_inference_and_kafka_numbers_reach_the_snapshot() -> None:
    state = MonitorState("r")
    state.add(_learner(0, version=3, versions_published=3, loss_policy=0.5, policy_lag_mean=0.4, policy_lag_max=2))
    state.add(
        MetricEvent(
            run="r",
            role="inference",
            source_id="gpu-0:8000",
            timestamp=_at(1),
            values={"policy_version": 3, "adapter_load_s": 0.2},
            labels={"event": "loaded"},
        )
    )
    state.set_kafka(consumer_lag=7, dlq_records=2)
    snap = state.snapshot(_at(2))
    assert (snap.learner_version, snap.versions_published, snap.served_version) == (3, 3, 3)
    assert snap.served_by == ["gpu-0:8000"]
    assert snap.policy_lag == {"mean": 0.4, "max": 2}
    assert snap.learners["learner-0"]["loss_policy"] == 0.5
    assert (snap.consumer_lag, snap.dlq_records) == (7, 2)


def test_each_server_shows_the_version_it_serves_and_its_lag_behind_the_learner() -> None:
    state = MonitorState("r")
    state.add(_server(1, "gpu-1:8000", "loaded", policy_version=1))
    state.add(_server(2, "gpu-0:8000", "loaded", policy_version=1))
    assert [r.lag for r in state.snapshot(_at(3)).servers] == [None, None]  # no learner yet: unknown, not 0
    state.add(_learner(3, version=4))
    state.add(_server(4, "gpu-0:8000", "loaded", policy_version=4))
    state.add(_server(5, "gpu-1:8000", "refused", refused_version=2))
    rows = state.snapshot(_at(6)).servers
    assert [(r.source_id, r.policy_version, r.lag, r.last_event) for r in rows] == [
        ("gpu-0:8000", 4, 0, "loaded"),
        ("gpu-1:8000", 1, 3, "refused"),  # a refusal keeps the version it last loaded
    ]
    assert rows[1].last_seen == _at(5)


def test_other_runs_and_older_reports_are_ignored() -> None:
    state = MonitorState("r")
    state.add(_collector(10, "a", 10, 0, policy_version=2))
    state.add(_collector(5, "a", 5, 0, policy_version=1))  # older: history overlap
    state.add(_collector(20, "a", 99, 0, run="other"))
    snap = state.snapshot(_at(20))
    assert snap.events_seen == 2
    assert snap.collectors[0].policy_version == 2 and snap.episodes_total == 10


def test_prune_keeps_what_the_windows_need() -> None:
    state = MonitorState("r", windows_s=(60.0,))
    for k in range(100):
        state.add(_collector(10 * k, "a", k, 0))
    before = state.snapshot(_at(990)).per_min
    state.prune(_at(990))
    assert state.snapshot(_at(990)).per_min == pytest.approx(before)
    assert len(state._episodes["a"].times) <= 8


def test_a_finished_run_is_shown_as_of_its_last_report() -> None:
    state = MonitorState("r", windows_s=(60.0,))
    state.add(_collector(0, "a", 0, 0))
    final = _collector(60, "a", 12, 6, policy_version=0)
    state.add(MetricEvent(**{**_fields(final), "labels": {"event": "final"}}))
    later = state.snapshot(_at(3600))  # an hour after the run ended
    assert later.rates_at == _at(60)
    assert later.per_min == pytest.approx(12.0) and later.windows[0].success == pytest.approx(0.5)
    assert later.collectors[0].status == "stopped"
    assert later.acting_versions == {0: 1}  # what the run acted with at its end
