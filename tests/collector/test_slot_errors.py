"""A collector's slots against errors between episodes, on a real broker with no policy server (every episode ends
as an inference error): a transient one costs a slot a back-off, one retrying cannot cure stops the collector with
its reason."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from distrl_stream.collector import Collector
from distrl_stream.config import Config
from distrl_stream.envs import SimEnv
from distrl_stream.envs.base import DeviceEnv
from distrl_stream.errors import ConfigError

pytestmark = pytest.mark.kafka

# Nothing listens there: each episode's first request is refused at once.
_NO_SERVER = {"url": "http://127.0.0.1:9", "retries": 0, "request_timeout_s": 2.0}


def _collector(make_config: Callable[..., Config], env_factory: Callable[[], DeviceEnv]) -> Collector:
    cfg = make_config(
        inference=_NO_SERVER,
        collector={"envs": 1, "max_episodes": 2, "error_backoff_s": 0.05, "error_backoff_max_s": 0.1},
    )
    return Collector(cfg, env_factory=env_factory)


def test_a_slot_whose_environment_fails_to_start_retries_and_goes_on(make_config: Callable[..., Config]) -> None:
    attempts: list[int] = []

    def flaky() -> DeviceEnv:
        attempts.append(1)
        if len(attempts) <= 2:
            raise RuntimeError("emulator not booted yet")
        return SimEnv()

    report = asyncio.run(asyncio.wait_for(_collector(make_config, flaky).run(), 60))
    assert len(attempts) >= 3
    assert report.episodes == 2 and report.by_termination == {"inference_error": 2}
    assert report.stop_reason == "max_episodes=2 reached" and report.failure is None


def test_an_error_retrying_cannot_cure_stops_the_collector_with_its_reason(make_config: Callable[..., Config]) -> None:
    def broken() -> DeviceEnv:
        raise ConfigError("env.adb_path", "no adb at /nonexistent")

    report = asyncio.run(asyncio.wait_for(_collector(make_config, broken).run(), 60))
    assert report.failure == "slot 0: ConfigError: env.adb_path: no adb at /nonexistent"
    assert report.stop_reason == f"failed: {report.failure}" and report.episodes == 0
    assert report.failure in report.summary()
