"""Reading a Prometheus endpoint in tests: one HTTP GET, parsed by prometheus_client's own text parser."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from distrl_stream.monitor.prometheus import RoleMetrics


def scrape(address: str, timeout_s: float = 10.0) -> list[Sample]:
    """Every sample at ``http://<address>/metrics`` (``address`` = host:port)."""
    response = httpx.get(f"http://{address}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of the samples called ``name`` that carry ``labels`` (None when there is none)."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return sum(found) if found else None


@pytest.fixture
def served() -> Iterator[list[RoleMetrics]]:
    """Metrics objects to close after the test (pass to :func:`serve`)."""
    opened: list[RoleMetrics] = []
    yield opened
    for metrics in opened:
        metrics.close()


def serve(metrics: RoleMetrics, served: list[RoleMetrics]) -> str:
    """Serve ``metrics`` on a free port, closed after the test; its host:port."""
    served.append(metrics)
    port = metrics.serve(0, "collector.metrics_port")
    assert port is not None and port > 0
    return f"127.0.0.1:{port}"
