"""End to end with a vision policy: collector → Kafka → learner → new version served, every action read from a
screenshot (the tiny vision-language model on the real vLLM server, the simulated phone drawing its screens).

What it proves: the collector captures a PNG of every screen and sends it to the chat endpoint; the steps carry the
claim check (the image itself never goes onto Kafka); the learner accepts the images (none dead-lettered), trains on
them and publishes versions; the server hot-loads them; and later episodes are acted by a trained version from their
screenshots.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from distrl_stream.config import Config
from distrl_stream.events import DeadLetter, MetricEvent, TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.events.screenshots import read_screenshot
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from tests.fixtures.processes import CLI, ChildProcesses
from tests.fixtures.vllm import VllmService

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.timeout(900)]

TRAINED_VERSION = 2


@pytest.fixture
def vision_run(
    make_config: Callable[..., Config], tiny_vl_server: VllmService
) -> Iterator[tuple[Config, WeightWatcher]]:
    cfg = make_config(
        model={"base": tiny_vl_server.model_dir},
        env={"templates": ["turn_on_setting"]},
        inference={"url": tiny_vl_server.url, "request_timeout_s": 30.0, "max_model_len": 1024},
    )
    ensure_run_topics(cfg)
    watcher = WeightWatcher(cfg, server_url=tiny_vl_server.url)
    watcher.start()
    try:
        yield cfg, watcher
    finally:
        watcher.stop()
        tiny_vl_server.unload_all_adapters()


def _trajectories(cfg: Config) -> list[TrajectoryEvent]:
    return [decode(m.value(), TrajectoryEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories)]


def test_a_vision_policy_collects_from_screenshots_learns_and_is_served(
    vision_run: tuple[Config, WeightWatcher], processes: ChildProcesses
) -> None:
    cfg, watcher = vision_run
    env = {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        # Both roles on the vision base: the collector's prompts then carry the screenshot.
        "DISTRL_MODEL__BASE": str(cfg.model.base),
        "DISTRL_ENV__TEMPLATES": '["turn_on_setting"]',
        "DISTRL_INFERENCE__URL": cfg.inference.url or "",
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "30",
        "DISTRL_LEARNER__BATCH_EPISODES": "2",
        "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "2",
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "2",
        "DISTRL_LEARNER__METRICS_INTERVAL_S": "2",
        "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
    }
    learn = ["learn", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]
    learn += ["--threads", "1"]
    collect = ["collect", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers, "--envs", "4"]
    collect += ["--collector-id", "c0"]
    processes.start([CLI, *learn], env)
    processes.start([CLI, *collect], env)
    processes.wait_for(f"version {TRAINED_VERSION} served", lambda: watcher.newest_version >= TRAINED_VERSION, 300)

    def acted_by_a_trained_version() -> bool:
        return any(s.policy_version >= 1 for e in _trajectories(cfg) for s in e.steps)

    processes.wait_for("an episode acted by a trained version", acted_by_a_trained_version, 120)
    processes.stop_all()

    episodes = _trajectories(cfg)
    steps = [s for e in episodes for s in e.steps]
    assert {e.base_model for e in episodes} == {Path(str(cfg.model.base)).name}
    # Every step claims its screenshot, which reads back as recorded (and is a PNG of the screen).
    for step in steps:
        assert step.screenshot_uri is not None and step.screenshot_sha256 is not None
        png = read_screenshot(step.screenshot_uri, step.screenshot_sha256)
        assert png.startswith(b"\x89PNG") and hashlib.sha256(png).hexdigest() == step.screenshot_sha256
    assert len({s.screenshot_sha256 for s in steps}) > 1  # different screens, different images
    # The images never travel on Kafka: a step's record is its text, tokens and the claim check.
    largest = max(len(m.value()) for m in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories))
    assert largest < 64 * 1024
    # The learner refused nothing and published versions the server loaded.
    assert list(read_topic(cfg.kafka, TopicNames(cfg.run).dlq)) == [], [
        decode(m.value(), DeadLetter).error_message for m in read_topic(cfg.kafka, TopicNames(cfg.run).dlq)
    ]
    published = [
        decode(m.value(), WeightVersionEvent).version for m in read_topic(cfg.kafka, TopicNames(cfg.run).weights)
    ]
    assert published[:TRAINED_VERSION] == list(range(1, TRAINED_VERSION + 1))
    metrics = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    loaded = {
        int(m.values["policy_version"]) for m in metrics if m.role == "inference" and m.labels["event"] == "loaded"
    }
    assert set(range(1, TRAINED_VERSION + 1)) <= loaded
    learner_updates = [m.values["updates"] for m in metrics if m.role == "learner" and "updates" in m.values]
    assert learner_updates and max(learner_updates) >= 2 * TRAINED_VERSION
