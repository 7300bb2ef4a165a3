"""Shared fixtures live in tests/fixtures/ as pytest plugins, one module per service."""

pytest_plugins: list[str] = [
    "tests.fixtures.release",
    "tests.fixtures.vllm",
    "tests.fixtures.kafka",
    "tests.fixtures.registry",
    "tests.fixtures.secured_kafka",
    "tests.fixtures.processes",
    "tests.fixtures.netns",
    "tests.monitor.scrape",  # the `served` fixture of the roles' metrics tests
]
