"""The roles' Prometheus metrics: names, labels and values over real HTTP, without any service."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from distrl_stream.collector.stats import CollectorStats
from distrl_stream.errors import ConfigError
from distrl_stream.events import Termination
from distrl_stream.inference.client import Server
from distrl_stream.learner.role import Counters
from distrl_stream.monitor.prometheus import CollectorMetrics, LearnerMetrics, RoleMetrics, UpMetrics, WatcherMetrics
from distrl_stream.monitor.tensorboard import scalar_writer
from tests.monitor.scrape import scrape, value

IDENTITY = {"run": "r1", "role": "collector", "source": "c-7"}


@pytest.fixture
def served() -> Iterator[list[RoleMetrics]]:
    """Metrics objects to close after the test."""
    opened: list[RoleMetrics] = []
    yield opened
    for metrics in opened:
        metrics.close()


def _serve(metrics: RoleMetrics, served: list[RoleMetrics]) -> str:
    served.append(metrics)
    port = metrics.serve(0, "collector.metrics_port")
    assert port is not None and port > 0
    return f"127.0.0.1:{port}"


def test_collector_counts_are_read_from_its_stats_at_scrape_time(served: list[RoleMetrics]) -> None:
    stats = CollectorStats()
    pool = (
        Server("http://gpu-0:8000", httpx.AsyncClient(), adapters={3: "a" * 64, 4: "b" * 64}, requests=5),
        Server("http://gpu-1:8000", httpx.AsyncClient(), requests=2, failovers=1),
    )
    metrics = CollectorMetrics(
        "r1", "c-7", stats, in_flight=lambda: 3, served_version=lambda: 4, policy_lag=lambda: None, servers=lambda: pool
    )
    address = _serve(metrics, served)
    assert value(scrape(address), "distrl_collector_steps_total", **IDENTITY) == 0

    for inference_s in (0.02, 0.2, 2.0):
        stats.step(inference_s, 0.001)
        metrics.step(inference_s, 0.001)
    stats.episode(Termination.SUCCESS, 2)
    metrics.episode(timedelta(seconds=0.7).total_seconds(), True)
    stats.episode(Termination.TRUNCATED, 1)
    metrics.episode(3.0, False)
    stats.published, stats.delivered = 2, 1
    samples = scrape(address)

    assert value(samples, "distrl_collector_steps_total", **IDENTITY) == 3
    assert value(samples, "distrl_collector_episodes_total", termination="success") == 1
    assert value(samples, "distrl_collector_episodes_total", termination="truncated") == 1
    assert value(samples, "distrl_collector_episodes_total", termination="env_error") == 0  # every one, from 0
    assert value(samples, "distrl_collector_successes_total") == 1
    assert value(samples, "distrl_collector_trajectories_published_total") == 2
    assert value(samples, "distrl_collector_trajectories_delivered_total") == 1
    assert value(samples, "distrl_collector_success_rate") == 0.5
    assert value(samples, "distrl_collector_episodes_in_flight") == 3
    assert value(samples, "distrl_collector_policy_version") == 4
    assert value(samples, "distrl_collector_server_requests_total", server="http://gpu-0:8000") == 5
    assert value(samples, "distrl_collector_server_requests_total", server="http://gpu-1:8000") == 2
    assert value(samples, "distrl_collector_server_failovers_total", server="http://gpu-1:8000") == 1
    assert value(samples, "distrl_collector_server_failovers_total", server="http://gpu-0:8000") == 0
    assert value(samples, "distrl_collector_server_policy_version", server="http://gpu-0:8000") == 4
    # Not read yet: no sample rather than a made-up version.
    assert value(samples, "distrl_collector_server_policy_version", server="http://gpu-1:8000") is None
    # Unknown (no pause_above_policy_lag): no sample rather than a made-up 0.
    assert value(samples, "distrl_collector_policy_lag_versions") is None
    assert value(samples, "distrl_collector_inference_latency_seconds_count") == 3
    assert value(samples, "distrl_collector_inference_latency_seconds_bucket", le="0.25") == 2
    assert value(samples, "distrl_collector_inference_latency_seconds_sum") == pytest.approx(2.22)
    assert value(samples, "distrl_collector_episode_duration_seconds_bucket", le="1.0") == 1
    assert value(samples, "distrl_collector_episode_duration_seconds_count") == 2


def test_learner_splits_update_statistics_into_losses_rho_and_the_rest(served: list[RoleMetrics]) -> None:
    counters = Counters(ingested=5, stale=1, dead=2, published=3)
    metrics = LearnerMetrics(
        "r1",
        "0",
        lambda: counters,
        version=lambda: 3,
        updates=lambda: 40,
        buffer=lambda: (5, 20, 0.002),
        consumer_lag=lambda: 7,
        ingest_queue=lambda: None,
    )
    metrics.update({"loss_policy": 0.5, "loss_critic": 0.25, "rho_mean": 1.1, "entropy": 0.9, "bad": float("nan")})
    metrics.policy_lag.observe(0)
    metrics.policy_lag.observe(4)
    samples = scrape(_serve(metrics, served))

    learner = {"run": "r1", "role": "learner", "source": "0"}
    assert value(samples, "distrl_learner_trajectories_total", status="ingested", **learner) == 5
    assert value(samples, "distrl_learner_trajectories_total", status="stale") == 1
    assert value(samples, "distrl_learner_dlq_records_total") == 2
    assert value(samples, "distrl_learner_versions_published_total") == 3
    assert value(samples, "distrl_learner_updates_total") == 40
    assert value(samples, "distrl_learner_version") == 3
    assert value(samples, "distrl_learner_buffer_steps") == 20
    assert value(samples, "distrl_learner_consumer_lag_records") == 7
    assert value(samples, "distrl_learner_ingest_queue_records") is None
    assert value(samples, "distrl_learner_loss", term="policy") == 0.5
    assert value(samples, "distrl_learner_loss", term="critic") == 0.25
    assert value(samples, "distrl_learner_rho", stat="mean") == 1.1
    assert value(samples, "distrl_learner_update_stat", stat="entropy") == 0.9
    assert value(samples, "distrl_learner_update_stat", stat="loss_policy") is None
    assert value(samples, "distrl_learner_update_stat", stat="bad") is None  # NaN is left out
    assert value(samples, "distrl_learner_policy_lag_versions_bucket", le="1.0") == 1
    counters.ingested += 1
    assert value(scrape(f"127.0.0.1:{metrics.port}"), "distrl_learner_trajectories_total", status="ingested") == 6


def test_watcher_reports_served_and_published_versions_and_their_lag(served: list[RoleMetrics]) -> None:
    state = {"served": 2, "published": 5}
    metrics = WatcherMetrics(
        "r1",
        "host:8000",
        served_version=lambda: state["served"],
        published_version=lambda: state["published"],
        loaded_versions=lambda: 2,
        refused=lambda: 1,
    )
    metrics.loaded(0.3)
    samples = scrape(_serve(metrics, served))
    assert value(samples, "distrl_inference_served_version", role="inference", source="host:8000") == 2
    assert value(samples, "distrl_inference_version_lag") == 3
    assert value(samples, "distrl_inference_version_loads_total") == 1
    assert value(samples, "distrl_inference_versions_refused_total") == 1
    assert value(samples, "distrl_inference_adapter_load_seconds_count") == 1


def test_two_roles_in_one_process_keep_their_own_registries(served: list[RoleMetrics]) -> None:
    a = UpMetrics("r1", processes=lambda: {"learner": True, "collector-0": False}, uptime_s=lambda: None)
    b = UpMetrics("r2", processes=lambda: {}, uptime_s=lambda: 5.0)
    first, second = scrape(_serve(a, served)), scrape(_serve(b, served))
    assert value(first, "distrl_up_process_running", process="learner", run="r1") == 1
    assert value(first, "distrl_up_process_running", process="collector-0") == 0
    assert value(first, "distrl_up_uptime_seconds") is None
    assert value(second, "distrl_up_uptime_seconds", run="r2") == 5.0
    assert value(second, "distrl_up_process_running") is None


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
    address = _serve(metrics, served)
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
