"""`distrl-stream learn` as a real process: kill -9 and restart lose and repeat nothing; SIGTERM exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from distrl_stream.config import Config
from distrl_stream.events import TrajectoryEvent
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import CheckpointStore, IngestLog, learner_dir, read_json
from tests.learner.simdata import sim_events

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CLI = str(Path(sys.executable).with_name("distrl-stream"))


def learner_process(cfg: Config, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_LEARNER__BATCH_EPISODES": "2",
        "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "2",
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "3",
        "DISTRL_LEARNER__METRICS_INTERVAL_S": "1",
    }
    args = [CLI, "learn", "--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]
    args += ["--model", str(cfg.model.base), "--checkpoint-interval", "2", "--threads", "1"]
    with log_path.open("ab") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


def produce(cfg: Config, events: list[TrajectoryEvent]) -> None:
    with Producer(cfg.kafka, client_id="test-collector") as producer:
        for event in events:
            producer.produce_event(TopicNames(cfg.run).trajectories, event)  # keyed by episode id: all partitions
        producer.flush()


def wait_for(
    what: str, predicate: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"learner exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_kill_9_and_restart_resumes_from_the_checkpoint_without_gaps_or_duplicates(
    make_config: Callable[..., Config], tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = make_config(model={"base": tiny_model_dir})
    ensure_run_topics(cfg)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    events = sim_events(tokenizer, 36, seed=7, run=cfg.run)
    member = learner_dir(cfg.run_dir, "0")
    store = CheckpointStore(member / "checkpoints")
    ingest_log = member / "ingested.log"
    log = tmp_path / "learner.log"

    produce(cfg, events[:16])
    first = learner_process(cfg, log)
    try:
        wait_for("a checkpoint", lambda: store.latest() is not None, first, log, 180)
        produce(cfg, events[16:28])

        def past_checkpoint() -> bool:
            latest = store.latest()
            if latest is None or not (latest / "state.json").exists():
                return False
            covered = sum(read_json(latest / "state.json")["offsets"].values())
            return len(IngestLog.read(ingest_log)) > covered  # records used since that checkpoint: lost by the kill

        wait_for("ingest past a checkpoint", past_checkpoint, first, log, 120)
    finally:
        first.kill()  # SIGKILL: no final checkpoint, no clean group leave
        first.wait()
    killed_at = read_json(store.latest() / "state.json")  # type: ignore[operator]

    produce(cfg, events[28:])
    second = learner_process(cfg, log)
    try:
        wait_for(
            "all 36 records used",
            lambda: len({(r.partition, r.offset) for r in IngestLog.read(ingest_log)}) >= 36,
            second,
            log,
            180,
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()

    assert "resumed from ckpt-" in log.read_text()
    final = read_json(store.latest() / "state.json")  # type: ignore[operator]
    assert final["updates"] > killed_at["updates"]
    records = IngestLog.read(ingest_log)
    # Exactly the produced episodes, each once; every partition's offsets contiguous from 0 to the checkpoint's.
    assert Counter(r.episode_id for r in records) == Counter(e.episode_id for e in events)
    for partition, end in final["offsets"].items():
        offsets = [r.offset for r in records if r.partition == int(partition)]
        assert offsets == list(range(end)), f"partition {partition}: {offsets}"
    assert sum(final["offsets"].values()) == 36
    assert final["counters"]["ingested"] == 36
