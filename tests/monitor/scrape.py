"""Reading a Prometheus endpoint in tests: one HTTP GET, parsed by prometheus_client's own text parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(address: str, timeout_s: float = 10.0) -> list[Sample]:
    """Every sample at ``http://<address>/metrics`` (``address`` = host:port)."""
    response = httpx.get(f"http://{address}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of the samples called ``name`` that carry ``labels`` (None when there is none)."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return sum(found) if found else None
