"""The collector's reader of ``{run}.weights`` (``PublishedVersions``) against a real broker: it reads on its own
thread, so a record that takes long to dead-letter never holds up the collector's event loop, and it takes only
versions it can use."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Message

from distrl_stream.artifacts import model_fingerprint, version_event
from distrl_stream.collector.published import PublishedVersions
from distrl_stream.config import Config
from distrl_stream.events import DeadLetter, WeightVersionEvent, decode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics


def _model(folder: Path, weights: bytes) -> Path:
    """A base model folder as far as its fingerprint goes: config.json and a weight file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def _version(cfg: Config, version: int, tmp_path: Path, fingerprint: str = "") -> WeightVersionEvent:
    adapter = tmp_path / f"adapter-{version}"
    adapter.mkdir(exist_ok=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"x" * version)
    return version_event(
        cfg.model,
        version,
        adapter,
        adapter_uri=adapter.as_uri(),
        base_fingerprint=fingerprint,
        learner_step=10 * version,
        trajectories_consumed=version,
    )


def _announce(cfg: Config, *events: WeightVersionEvent) -> None:
    with Producer(cfg.kafka) as producer:
        for event in events:
            producer.produce_event(TopicNames(cfg.run).weights, event)


async def _until(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.kafka
async def test_a_dead_letter_that_hangs_on_the_broker_never_holds_up_the_collectors_loop(
    make_config: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_config()
    ensure_run_topics(cfg)
    entered, release = threading.Event(), threading.Event()
    send = DeadLetterQueue.send

    def hanging_send(self: DeadLetterQueue, msg: Message, error: BaseException) -> None:
        # The transactional take-over of a dead letter's partition, stuck on an unreachable coordinator.
        entered.set()
        release.wait(5.0)
        send(self, msg, error)

    monkeypatch.setattr(DeadLetterQueue, "send", hanging_send)
    with Producer(cfg.kafka) as producer:
        producer.produce(TopicNames(cfg.run).weights, b"not an event", cfg.model.policy_id)
    impossible = dataclasses.replace(_version(cfg, 7, tmp_path), sha256="not-a-digest")
    _announce(cfg, impossible, _version(cfg, 1, tmp_path))
    published = PublishedVersions(cfg, "test-weights")
    await asyncio.to_thread(published.start)
    try:
        held, polls_while_hanging, deadline = 0.0, 0, time.monotonic() + 30
        while polls_while_hanging < 10:  # polling as the pause check does, until the letter hangs and on
            assert time.monotonic() < deadline, "the first dead letter was never sent"
            started = time.monotonic()
            latest = published.poll()
            held = max(held, time.monotonic() - started)
            polls_while_hanging += entered.is_set()
            await asyncio.sleep(0.01)
        assert held < 0.5, f"poll() held the event loop for {held:.1f} s"
        assert latest == 0  # the reader is still on the first record
        release.set()
        await _until(lambda: published.poll() == 1, "version 1 to be taken")
        assert published.learner_step == 10 and published.dead_lettered == 2
    finally:
        release.set()
        published.close()
    letters = [decode(m.value(), DeadLetter) for m in read_topic(cfg.kafka, TopicNames(cfg.run).dlq, timeout_s=30)]
    assert [letter.error_message for letter in letters] == [
        "not Avro: text b'not an event'",
        "impossible value: weight version policy v7: sha256 'not-a-digest' is not 64 hex digits",
    ]


@pytest.mark.kafka
async def test_a_version_for_another_model_in_a_folder_of_the_same_name_is_not_taken(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    ours = _model(tmp_path / "here" / "model", b"our weights")
    theirs = _model(tmp_path / "there" / "model", b"other weights")
    cfg = make_config(model={"base": str(ours)})
    ensure_run_topics(cfg)
    # v2 comes from a learner on the other folder, v1 from one on ours: both folders are called "model".
    _announce(
        cfg,
        _version(cfg, 2, tmp_path, model_fingerprint(theirs)),
        _version(cfg, 1, tmp_path, model_fingerprint(ours)),
    )
    published = PublishedVersions(cfg, "test-weights")
    await asyncio.to_thread(published.start)
    try:
        await _until(lambda: published.poll() >= 1, "a version to be taken")
        assert published.poll() == 1 and published.learner_step == 10
        assert published.foreign == [2]
    finally:
        published.close()
