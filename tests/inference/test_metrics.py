"""The weight watcher's Prometheus metrics, scraped over HTTP."""

from __future__ import annotations

from distrl_stream.inference.metrics import WatcherMetrics
from distrl_stream.monitor.prometheus import RoleMetrics
from tests.monitor.scrape import scrape, serve, value


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
    samples = scrape(serve(metrics, served))
    assert value(samples, "distrl_inference_served_version", role="inference", source="host:8000") == 2
    assert value(samples, "distrl_inference_version_lag") == 3
    assert value(samples, "distrl_inference_version_loads_total") == 1
    assert value(samples, "distrl_inference_versions_refused_total") == 1
    assert value(samples, "distrl_inference_adapter_load_seconds_count") == 1
