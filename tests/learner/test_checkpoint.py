"""Checkpoint pieces without services: atomic numbered folders, the ingest log, and an exact trainer round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distrl_stream.config import LearnerConfig, ModelConfig
from distrl_stream.errors import CheckpointError
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.checkpoint import CheckpointStore, IngestLog
from distrl_stream.learner.records import episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from tests.learner.simdata import sim_events

torch.set_num_threads(1)


def test_store_numbers_checkpoints_and_keeps_the_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    assert store.latest() is None
    for i in range(3):
        store.save(lambda folder, i=i: (folder / "n").write_text(str(i)))
    assert [p.name for p in store.all()] == ["ckpt-00000002", "ckpt-00000003"]
    assert (store.latest() / "n").read_text() == "2"  # type: ignore[operator]


def test_failed_write_leaves_the_previous_checkpoint_alone(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    first = store.save(lambda folder: (folder / "n").write_text("ok"))

    def broken(folder: Path) -> None:
        (folder / "n").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.save(broken)
    assert store.all() == [first]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [first.name]  # no temporary folder left


def test_save_removes_what_a_write_killed_midway_left(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    first = store.save(lambda folder: (folder / "n").write_text("ok"))
    leftover = tmp_path / "ckpt" / ".ckpt-00000002.k1ll3d.tmp"  # atomic_dir's temporary of a SIGKILLed write
    leftover.mkdir()
    (leftover / "n").write_text("half")
    second = store.save(lambda folder: (folder / "n").write_text("ok"))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [first.name, second.name]


def test_ingest_log_truncates_back_to_a_checkpoint(tmp_path: Path) -> None:
    log = IngestLog(tmp_path / "ingested.log")
    log.append(0, 0, "a", "ingested")
    log.append(1, 0, "b\twith tab", "stale")
    size = log.sync()
    log.append(0, 1, "c", "ingested")  # after the checkpoint: must be forgotten on restart
    log.sync()
    log.truncate(size)
    records = IngestLog.read(tmp_path / "ingested.log")
    assert [(r.partition, r.offset, r.episode_id, r.status) for r in records] == [
        (0, 0, "a", "ingested"),
        (1, 0, "b with tab", "stale"),
    ]
    with pytest.raises(CheckpointError, match="the checkpoint recorded"):
        log.truncate(size + 100)


def test_trainer_round_trip_continues_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = LearnerConfig(batch_episodes=4, min_buffer_episodes=4, policy_lr=1e-3, critic_lr=1e-3)
    model, tokenizer = load_policy(tiny_model_dir, ModelConfig())
    trainer = Trainer(cfg, model, tokenizer, ReplayBuffer.from_config(cfg))
    for ev in sim_events(tokenizer, 8, seed=1):
        trainer.buffer.add(episode_from_event(ev))
    for _ in range(2):
        assert trainer.update(version=0) is not None
    trainer.save_adapter(tmp_path / "adapter")
    torch.save(trainer.state_dict(), tmp_path / "trainer.pt")
    (tmp_path / "buffer.json").write_text(json.dumps(trainer.buffer.state_dict()))
    expected = trainer.update(version=0)

    model2, tokenizer2 = load_policy(tiny_model_dir, ModelConfig(), tmp_path / "adapter")
    buffer = ReplayBuffer.from_state_dict(json.loads((tmp_path / "buffer.json").read_text()))
    restored = Trainer(cfg, model2, tokenizer2, buffer)
    restored.load_state_dict(torch.load(tmp_path / "trainer.pt", weights_only=True))
    got = restored.update(version=0)
    assert expected is not None and got is not None
    assert restored.updates == trainer.updates == 3
    for key in ("loss_policy", "loss_critic", "entropy", "rho_mean", "sampled_priority_mean"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
