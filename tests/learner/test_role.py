"""The learner role against a real broker (tiny model): publishing, round mode, dead letters and drops, restarts (the
replay shard, replayed episodes, unusable episodes), and a real collector's minute of BrowserGym MiniWoB++ episodes
(the session's vLLM server acting, the only test here that needs it) ingested and trained on."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from distrl_stream.artifacts import adapter_dir, fetch, model_fingerprint, sha256_dir
from distrl_stream.collector import Collector
from distrl_stream.config import Config, MonitorConfig
from distrl_stream.events import (
    DeadLetter,
    Tensor,
    Termination,
    TrajectoryEvent,
    WeightVersionEvent,
    decode,
    encode,
)
from distrl_stream.events.screenshots import ScreenshotStore, read_screenshot
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import IngestLog, read_json
from distrl_stream.learner.ingest import TrajectoryReader
from distrl_stream.learner.records import episode_from_event
from distrl_stream.learner.role import Learner
from distrl_stream.policy.model import build_model
from distrl_stream.policy.prompt import Prompter
from distrl_stream.policy.vision import load_processor
from tests.fixtures.vllm import VllmService
from tests.learner.simdata import sim_events
from tests.monitor.scrape import scrape, value
from tests.monitor.wandb_files import offline_runs

pytestmark = pytest.mark.kafka
torch.set_num_threads(1)


@pytest.fixture
def learner_config(make_config: Callable[..., Config], tiny_model_dir: Path) -> Callable[..., Config]:
    def make(**learner: object) -> Config:
        settings = {
            "batch_episodes": 2,
            "min_buffer_episodes": 2,
            "updates_per_version": 2,
            "checkpoint_interval_updates": 1000,
            "metrics_interval_s": 0.5,
            "priority_refresh_interval": 1000,
            **learner,
        }
        return make_config(model={"base": tiny_model_dir}, learner=settings)

    return make


@pytest.fixture
def started() -> Iterator[Callable[[Config], Learner]]:
    learners: list[Learner] = []

    def start(cfg: Config) -> Learner:
        learner = Learner(cfg)
        learner.start()
        learners.append(learner)
        return learner

    yield start
    for learner in learners:
        learner.close()


class Running:
    """A learner's run loop in a thread, stopped (cleanly, with its final checkpoint) at the end."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.learner.run(self.stop)
        except BaseException as exc:
            self.error = exc

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert self.error is None, f"learner failed: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, f"learner failed: {self.error!r}"


def produce(cfg: Config, values: list[TrajectoryEvent | bytes]) -> None:
    topic = TopicNames(cfg.run).trajectories
    with Producer(cfg.kafka, client_id="test-collector") as producer:
        for value in values:
            if isinstance(value, bytes):
                producer.produce(topic, value, key=b"poison", partition=0)
            else:
                producer.produce(topic, encode(value), key=value.episode_id.encode(), partition=0)
        producer.flush()


def weight_events(cfg: Config) -> list[WeightVersionEvent]:
    return [decode(m.value(), WeightVersionEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).weights)]


def test_publish_writes_the_artifact_before_the_event(
    learner_config: Callable[..., Config],
    started: Callable[[Config], Learner],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    cfg = learner_config()
    learner = started(cfg)
    event = learner.publish()
    assert event.version == 1 and learner.version == 1
    [seen] = weight_events(cfg)
    assert seen == event
    assert seen.adapter_uri.startswith(f"kafka://{TopicNames(cfg.run).artifacts}/0/")  # artifacts.store default
    assert sha256_dir(adapter_dir(cfg, 1)) == seen.sha256
    fetched = fetch(
        seen.adapter_uri, tmp_path / "fetched", sha256=seen.sha256, size_bytes=seen.size_bytes, kafka=cfg.kafka
    )
    assert (fetched / "adapter_config.json").is_file()
    assert seen.base_fingerprint == model_fingerprint(learner._model_dir)

    # A failed artifact write publishes nothing: no event may ever name a missing or partial adapter.
    def broken(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(learner.trainer, "save_adapter", broken)
    with pytest.raises(OSError, match="disk full"):
        learner.publish()
    assert weight_events(cfg) == [event]
    assert learner.version == 1
    assert not adapter_dir(cfg, 2).exists()


def test_a_lost_metric_event_is_counted_and_does_not_fail_the_next_publish(
    make_config: Callable[..., Config], tiny_model_dir: Path, started: Callable[[Config], Learner], kafka_admin: Admin
) -> None:
    cfg = make_config(model={"base": tiny_model_dir}, kafka={"client": {"message.timeout.ms": "1500"}})
    learner = started(cfg)
    # A metrics topic gone (as in an outage longer than message.timeout.ms): the event's delivery fails for good.
    kafka_admin.delete_topics([TopicNames(cfg.run).metrics])
    deadline = time.monotonic() + 30
    while learner.counters.metrics_lost == 0:
        assert time.monotonic() < deadline, "the metric event's delivery never failed"
        learner.emit_metrics()  # each emission serves the delivery reports of the earlier ones
        time.sleep(0.5)
    event = learner.publish()
    assert event is not None and [e.version for e in weight_events(cfg)] == [1]
    assert learner.metrics()["metric_events_lost"] >= 1


def test_round_mode_waits_for_a_round_of_the_current_version_then_publishes_once(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    cfg = learner_config(round_episodes=3, updates_per_version=2)
    learner = started(cfg)
    tokenizer = learner.trainer.tokenizer
    running = Running(learner)
    produce(cfg, sim_events(tokenizer, 2, seed=1, version=0))
    running.wait_for("2 episodes", lambda: learner.counters.ingested == 2)
    assert learner.trainer.updates == 0  # the buffer could train, but the round is not complete
    produce(cfg, sim_events(tokenizer, 1, seed=2, version=0))
    running.wait_for("version 1", lambda: learner.version == 1)
    assert learner.trainer.updates == 2

    produce(cfg, sim_events(tokenizer, 3, seed=3, version=0))  # acted by the previous version: no new round
    running.wait_for("6 episodes", lambda: learner.counters.ingested == 6)
    time.sleep(1.0)  # a wrong learner would update within this second; a right one waits for version-1 data
    assert (learner.trainer.updates, learner.version) == (2, 1)
    produce(cfg, sim_events(tokenizer, 3, seed=4, version=1))
    running.wait_for("version 2", lambda: learner.version == 2)
    assert learner.trainer.updates == 4

    # Attempts whose version nothing tells count towards the round: one that failed before its first step (a sync
    # collector publishes it) and an undecodable record. Without them the round would wait for good.
    failed = dataclasses.replace(
        sim_events(tokenizer, 1, seed=5, version=2)[0], steps=[], termination=Termination.ENV_ERROR
    )
    produce(cfg, [failed, b"not a trajectory", *sim_events(tokenizer, 1, seed=6, version=2)])
    running.wait_for("version 3", lambda: learner.version == 3)
    running.finish()
    assert learner.trainer.updates == 6
    assert (learner.counters.incomplete, learner.counters.dead) == (1, 1)
    assert [e.version for e in weight_events(cfg)] == [1, 2, 3]


def test_replay_ratio_caps_updates_per_record_read(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    cfg = learner_config(max_replay_ratio=2.0, batch_episodes=2, updates_per_version=100)
    learner = started(cfg)
    tokenizer = learner.trainer.tokenizer
    running = Running(learner)
    produce(cfg, sim_events(tokenizer, 4, seed=1, version=0))
    # 4 episodes in at 2 samples per episode: 8 sampled episodes, 4 updates of 2, and no more.
    running.wait_for("4 updates", lambda: learner.trainer.updates >= 4)
    time.sleep(1.0)  # an uncapped learner makes several more updates of the tiny model within this second
    assert learner.trainer.updates == 4
    assert learner.replay_ratio() == 2.0
    produce(cfg, sim_events(tokenizer, 2, seed=2, version=0))
    running.wait_for("6 updates", lambda: learner.trainer.updates >= 6)
    time.sleep(1.0)
    assert learner.trainer.updates == 6
    # A record the learner cannot use still counts, as it does in the collectors' rate limit: one more update.
    produce(cfg, [b"not a trajectory"])
    running.wait_for("7 updates", lambda: learner.trainer.updates >= 7)
    time.sleep(1.0)
    running.finish()
    assert learner.trainer.updates == 7


def test_the_replay_cap_counts_the_records_read_before_a_restart(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    # 8 records at 2 samples per record and 4 episodes a batch: 4 updates in all, whether or not the learner
    # restarted in between. Counting only what a restarted learner read since would allow none with the collectors
    # paused at their budget (no new record), and both sides would wait.
    cfg = learner_config(max_replay_ratio=2.0, batch_episodes=4, min_buffer_episodes=4, max_updates=1)
    learner = started(cfg)
    produce(cfg, sim_events(learner.trainer.tokenizer, 8, seed=31))
    learner.run()  # stops at max_updates with a checkpoint
    learner.close()
    assert learner.trainer.updates == 1

    again = started(cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"max_updates": 0})}))
    running = Running(again)
    running.wait_for("4 updates", lambda: again.trainer.updates >= 4)
    time.sleep(1.0)  # an uncapped learner makes several more updates of the tiny model within this second
    running.finish()
    assert again.trainer.updates == 4 and again.replay_ratio() == 2.0


def test_a_fresh_adapter_is_drawn_from_the_learner_seed(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    def lora_a(seed: int) -> list[torch.Tensor]:
        torch.rand(7)  # whatever ran before in the process must not matter
        model = started(learner_config(seed=seed)).trainer.model
        return [p.detach().clone() for name, p in model.named_parameters() if "lora_A" in name]

    first, again, other = lora_a(1), lora_a(1), lora_a(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_a_replay_loads_episodes_in_the_order_they_were_produced_whatever_their_partitions(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    source = learner_config()
    ensure_run_topics(source)
    events = sim_events(AutoTokenizer.from_pretrained(source.model.base), 8, seed=3)
    partitions = source.kafka.trajectory_partitions
    with Producer(source.kafka, client_id="test-collector") as producer:
        for i, event in enumerate(events):
            # Later episodes in lower partitions, so a partition-by-partition read would reverse them.
            producer.produce(
                TopicNames(source.run).trajectories,
                encode(event),
                key=event.episode_id.encode(),
                partition=partitions - 1 - i % partitions,
                timestamp_ms=1_700_000_000_000 + i,
            )
        producer.flush()
    loaded = []
    for _ in range(2):
        learner = started(learner_config())  # its episodes are checked against its policy's base and tokens
        assert learner.load_replay(source.run) == len(events)
        loaded.append([e.episode_id for _k, e in learner.buffer.items()])
    assert loaded[0] == loaded[1] == [e.episode_id for e in events]


def test_poison_stale_and_good_records_are_each_handled_and_logged(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    cfg = learner_config(drop_above_policy_lag=1, min_buffer_episodes=100)
    learner = started(cfg)
    for _ in range(3):
        learner.publish()  # the learner is at version 3
    tokenizer = learner.trainer.tokenizer
    good = sim_events(tokenizer, 2, seed=5, version=2)
    stale = sim_events(tokenizer, 1, seed=6, version=1)
    produce(cfg, [good[0], b"not a trajectory", stale[0], good[1]])
    running = Running(learner)
    running.wait_for(
        "4 records", lambda: sum((learner.counters.ingested, learner.counters.stale, learner.counters.dead)) == 4
    )
    running.finish()
    assert (learner.counters.ingested, learner.counters.stale, learner.counters.dead) == (2, 1, 1)
    assert sorted(e.episode_id for _k, e in learner.buffer.items()) == sorted(e.episode_id for e in good)
    records = IngestLog.read(learner.ingest_log.path)
    assert [(r.offset, r.status) for r in records] == [(0, "ingested"), (1, "dead"), (2, "stale"), (3, "ingested")]
    [letter] = [decode(m.value(), DeadLetter) for m in read_topic(cfg.kafka, TopicNames(cfg.run).dlq)]
    assert (letter.topic, letter.partition, letter.offset, letter.value) == (
        TopicNames(cfg.run).trajectories,
        0,
        1,
        b"not a trajectory",
    )
    # The final checkpoint holds the offsets past all four records.
    state = (learner.store.latest() / "state.json").read_text()  # type: ignore[operator]
    assert '"offsets":{"0":4' in state


def test_prometheus_endpoint_shows_ingest_dead_letters_updates_losses_and_lag(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    cfg = learner_config(metrics_port=0)
    learner = started(cfg)
    address = f"127.0.0.1:{learner.prometheus.port}"
    assert value(scrape(address), "distrl_learner_trajectories_total", status="ingested") == 0
    produce(cfg, [*sim_events(learner.trainer.tokenizer, 4, seed=7, version=0), b"not a trajectory"])
    running = Running(learner)
    running.wait_for("version 1", lambda: learner.version >= 1)
    # The lag is measured every metrics_interval_s: it reaches 0 once every record was taken in.
    running.wait_for("lag 0", lambda: value(scrape(address), "distrl_learner_consumer_lag_records") == 0)
    samples = scrape(address)
    running.finish()
    member = {"run": cfg.run, "role": "learner", "source": "0"}  # a single member is rank 0
    assert value(samples, "distrl_learner_trajectories_total", status="ingested", **member) == 4
    assert value(samples, "distrl_learner_dlq_records_total", **member) == 1
    assert value(samples, "distrl_learner_updates_total") >= 2
    assert value(samples, "distrl_learner_versions_published_total") >= 1
    assert value(samples, "distrl_learner_version") >= 1
    assert value(samples, "distrl_learner_buffer_episodes") == 4
    assert value(samples, "distrl_learner_loss", term="policy") is not None
    assert value(samples, "distrl_learner_rho", stat="mean") > 0
    assert value(samples, "distrl_learner_policy_lag_versions_count") == sum(
        len(e.steps) for _k, e in learner.buffer.items()
    )


def held(learner: Learner) -> list[str]:
    return [e.episode_id for _k, e in learner.buffer.items()]


def shard_origins(checkpoint: Path) -> set[tuple[int, int]]:
    shards = read_json(checkpoint / "state.json")["shards"]
    return {(int(p), int(o)) for p, shard in shards.items() for o in shard["priorities"]}


def not_among_candidates(tokenizer: PreTrainedTokenizerBase, event: TrajectoryEvent) -> TrajectoryEvent:
    """``event`` with step 1's action a well-formed one that is none of its candidates: its tokens cannot have been
    drawn under the choice."""
    action = [*tokenizer('{"action_type":"click","index":99}')["input_ids"], tokenizer.eos_token_id]
    step = dataclasses.replace(
        event.steps[1],
        token_ids=Tensor.from_numpy(np.array(action, dtype=np.int32)),
        token_logprobs=Tensor.from_numpy(np.full(len(action), -0.1, dtype=np.float32)),
    )
    return dataclasses.replace(event, steps=[event.steps[0], step, *event.steps[2:]])


def test_unusable_episodes_are_dead_lettered_with_their_reason_and_never_reach_the_buffer(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    # Every update refreshes every priority: an impossible action in the buffer would meet log π at once. The restart
    # trains on its re-read shard before the two episodes produced after it (at version 0) may arrive: they are not
    # to be dropped as stale.
    cfg = learner_config(priority_refresh_interval=1, checkpoint_interval_updates=1, drop_above_policy_lag=1_000_000)
    learner = started(cfg)
    tokenizer = learner.trainer.tokenizer
    good = sim_events(tokenizer, 4, seed=11)
    [not_a_candidate, foreign] = sim_events(tokenizer, 2, seed=12)
    not_a_candidate = not_among_candidates(tokenizer, not_a_candidate)
    foreign = dataclasses.replace(foreign, base_model="another-base")
    produce(cfg, [good[0], not_a_candidate, good[1], foreign, good[2], good[3]])
    running = Running(learner)
    running.wait_for("6 records", lambda: learner.counters.ingested + learner.counters.dead == 6)
    running.wait_for("updates on the good episodes", lambda: learner.trainer.updates >= 3)
    running.finish()
    assert (learner.counters.ingested, learner.counters.dead, learner.trainer.rejected) == (4, 2, 0)
    assert sorted(held(learner)) == sorted(e.episode_id for e in good)
    records = IngestLog.read(learner.ingest_log.path)
    assert [r.status for r in records] == ["ingested", "dead", "ingested", "dead", "ingested", "ingested"]
    letters = [decode(m.value(), DeadLetter) for m in read_topic(cfg.kafka, TopicNames(cfg.run).dlq)]
    by_source = {letter.offset: letter.error_message for letter in letters}
    assert sorted(by_source) == [1, 3] and len(letters) == 2
    assert by_source[1].startswith(f"impossible value: episode {not_a_candidate.episode_id!r} step 1: token ")
    assert by_source[1].endswith("(its action tokens are not one of its candidates)")
    assert by_source[3] == (
        f"impossible value: episode {foreign.episode_id!r} was acted by base model 'another-base', "
        "not by this learner's 'tiny'"
    )
    learner.close()

    # The restart re-reads the shard (nothing unusable in it) and trains on, refreshing every priority again.
    again = started(cfg)
    running = Running(again)
    produce(cfg, sim_events(tokenizer, 2, seed=13))
    running.wait_for("2 more episodes", lambda: again.counters.ingested == 6)
    running.wait_for("updates after the restart", lambda: again.trainer.updates >= learner.trainer.updates + 2)
    running.finish()
    assert len(held(again)) == 6 and again.counters.dead == 2 and again.trainer.rejected == 0


def test_an_unusable_episode_a_checkpoint_held_from_before_is_left_out_when_its_shard_is_re_read(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = learner_config(priority_refresh_interval=1)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.base)
    good = sim_events(tokenizer, 2, seed=14)
    [bad] = sim_events(tokenizer, 1, seed=15)
    bad = not_among_candidates(tokenizer, bad)
    ensure_run_topics(cfg)
    produce(cfg, [good[0], bad, good[1]])
    with monkeypatch.context() as patched:
        # A learner from before ingest checked an action against its candidates, and one that does not train (an
        # update could notice the action): the episode is in its buffer, so in its checkpoint's shard.
        patched.setattr(Learner, "_convert", lambda _learner, event: episode_from_event(event), raising=False)
        patched.setattr(Learner, "_should_update", lambda _learner: False)
        learner = started(cfg)
        running = Running(learner)
        running.wait_for("3 episodes", lambda: learner.counters.ingested == 3)
        running.finish()
        learner.close()
    assert shard_origins(learner.store.latest()) == {(0, 0), (0, 1), (0, 2)}  # type: ignore[arg-type]

    again = started(cfg)
    running = Running(again)
    running.wait_for("the shard re-read", lambda: again.counters.rejected == 1 and len(again.buffer) == 2)
    running.wait_for("updates, each refreshing every priority", lambda: again.trainer.updates >= 3)
    running.finish()
    assert held(again) == [e.episode_id for e in good] and again.trainer.rejected == 0


def test_a_checkpoint_right_after_a_restart_holds_the_whole_shard(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = learner_config(checkpoint_interval_updates=1, checkpoint_keep=1000, updates_per_version=1000)
    learner = started(cfg)
    produce(cfg, sim_events(learner.trainer.tokenizer, 6, seed=21))
    running = Running(learner)
    running.wait_for("6 episodes", lambda: learner.counters.ingested == 6)
    running.finish()
    learner.close()
    before = learner.store.all()
    shard = shard_origins(before[-1])
    assert shard == {(0, o) for o in range(6)}

    # The re-read reaches the trainer one record at a time: the buffer has enough for an update after two.
    drain = TrajectoryReader.drain
    monkeypatch.setattr(TrajectoryReader, "drain", lambda reader, max_entries=None: drain(reader, 1))
    again = started(cfg)
    running = Running(again)
    running.wait_for("a checkpoint after the restart", lambda: len(again.store.all()) > len(before))
    running.finish()
    after = again.store.all()[len(before) :]
    assert [shard_origins(c) for c in after] == [shard] * len(after)
    assert sorted(held(again)) == sorted(held(learner))


def test_replayed_episodes_stay_in_the_shard_across_restarts(
    learner_config: Callable[..., Config], started: Callable[[Config], Learner]
) -> None:
    source = learner_config()
    ensure_run_topics(source)
    tokenizer = AutoTokenizer.from_pretrained(source.model.base)
    replayed = sim_events(tokenizer, 4, seed=31)
    produce(source, replayed)
    # The restarted learner trains on the replayed episodes from its first second, hundreds of versions before its
    # reader is assigned the online ones (acted by version 0): none may be dropped as stale for that.
    cfg = learner_config(drop_above_policy_lag=1_000_000)
    learner = Learner(cfg)
    try:
        learner.start(from_replay=source.run, replay_updates=1)
        assert held(learner) == [e.episode_id for e in replayed]
    finally:
        learner.close()

    # Restarted, the learner re-reads them from the source topic before it goes on.
    again = started(cfg)
    assert held(again) == [e.episode_id for e in replayed]
    topic = TopicNames(source.run).trajectories
    recorded = read_json(learner.store.latest() / "state.json")["replayed"]  # type: ignore[operator]
    assert list(recorded) == [topic] and sorted(int(o) for o in recorded[topic]["0"]) == [0, 1, 2, 3]
    online = sim_events(tokenizer, 2, seed=32)
    produce(cfg, online)
    running = Running(again)
    running.wait_for("2 online episodes", lambda: again.counters.ingested == 2)
    running.finish()
    again.close()
    # ... and its next checkpoint still records them, beside the run's own shard.
    third = started(cfg)
    running = Running(third)
    running.wait_for("the shard re-read", lambda: len(third.buffer) == 6)
    running.finish()
    assert held(third) == [e.episode_id for e in [*replayed, *online]]


def test_a_vision_learner_updates_on_screenshots_and_dead_letters_a_missing_or_altered_one(
    make_config: Callable[..., Config],
    started: Callable[[Config], Learner],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    base = build_model(tmp_path_factory.mktemp("models") / "tiny-vl", "tiny-vl")
    settings = {"batch_episodes": 2, "min_buffer_episodes": 2, "updates_per_version": 2, "metrics_interval_s": 0.5}
    cfg = make_config(model={"base": base}, learner={**settings, "priority_refresh_interval": 1})
    learner = started(cfg)
    assert learner.trainer.prompter.vision
    store = ScreenshotStore(tmp_path / "screenshots")
    tokenizer = AutoTokenizer.from_pretrained(base)
    # Prompted as its collectors prompt it: the screenshot in a chat message (a scripted policy records no prompt ids
    # for an image prompt, so the learner renders these; docs/design.md §6.2).
    prompter = Prompter(load_processor(base), vision=True)
    good = sim_events(tokenizer, 4, seed=21, screenshots=store, base_model="tiny-vl", prompter=prompter)
    altered, missing = sim_events(tokenizer, 2, seed=22, screenshots=store, base_model="tiny-vl", prompter=prompter)
    # Each bad episode's first screenshot, claimed at a path of its own (the store shares identical screens).
    first = altered.steps[0]
    forged = tmp_path / "forged.png"
    forged.write_bytes(read_screenshot(first.screenshot_uri, first.screenshot_sha256)[:-1] + b"\0")  # type: ignore[arg-type]
    altered = dataclasses.replace(
        altered, steps=[dataclasses.replace(first, screenshot_uri=forged.as_uri()), *altered.steps[1:]]
    )
    gone = (tmp_path / "gone.png").as_uri()
    missing = dataclasses.replace(
        missing, steps=[dataclasses.replace(missing.steps[0], screenshot_uri=gone), *missing.steps[1:]]
    )
    produce(cfg, [good[0], altered, good[1], missing, good[2], good[3]])
    running = Running(learner)
    running.wait_for("6 records", lambda: learner.counters.ingested + learner.counters.dead == 6)
    running.wait_for("a version from updates on images", lambda: learner.version >= 1, timeout_s=120)
    running.finish()
    assert (learner.counters.ingested, learner.counters.dead) == (4, 2)
    assert sorted(held(learner)) == sorted(e.episode_id for e in good)
    # Updates computed on the screenshots: the critic's features are of image prompts (keyed by text and digest).
    assert learner.trainer.features.misses > 0
    shown = {s.screenshot_sha256 for e in good for s in e.steps}
    assert all(isinstance(key, tuple) and key[1] in shown for key in learner.trainer.features._cache)
    letters = {
        letter.offset: letter.error_message
        for letter in (decode(m.value(), DeadLetter) for m in read_topic(cfg.kafka, TopicNames(cfg.run).dlq))
    }
    assert sorted(letters) == [1, 3]
    assert letters[1].startswith(f"impossible value: episode {altered.episode_id!r} step 0: screenshot file://")
    assert " altered: sha256 " in letters[1]
    assert letters[3] == (
        f"impossible value: episode {missing.episode_id!r} step 0: screenshot {gone} unreadable: "
        "No such file or directory"
    )
    # The published adapter is the language tower's LoRA (what vLLM serves on a vision-language model).
    [event] = weight_events(cfg)[:1]
    config = json.loads((adapter_dir(cfg, event.version) / "adapter_config.json").read_text())
    assert config["target_modules"].startswith("model\\.text_model\\.")


def test_an_object_store_outage_costs_versions_not_the_learner(
    make_config: Callable[..., Config],
    tiny_model_dir: Path,
    started: Callable[[Config], Learner],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    artifacts = {"store": "memory://bucket/outage", "upload_retries": 1, "upload_backoff_s": 0.01}
    cfg = make_config(model={"base": tiny_model_dir}, artifacts=artifacts)
    learner = started(cfg)
    put = MemoryFileSystem.put

    def down(self: MemoryFileSystem, *args: object, **kwargs: object) -> None:
        raise PermissionError("403 AccessDenied")

    monkeypatch.setattr(MemoryFileSystem, "put", down)
    learner._publish_through_outages()  # what the run loop calls every updates_per_version updates
    assert learner.version == 0 and weight_events(cfg) == []
    assert learner.metrics()["versions_not_uploaded"] == 1
    monkeypatch.setattr(MemoryFileSystem, "put", put)
    learner._publish_through_outages()
    # The lost version's number is not reused: its adapter stays on the learner's disk.
    assert [e.version for e in weight_events(cfg)] == [2] and learner.version == 2
    assert learner.metrics()["versions_not_uploaded"] == 1


def test_the_artifact_folder_keeps_the_newest_keep_versions_a_server_may_still_fetch(
    make_config: Callable[..., Config], tiny_model_dir: Path, started: Callable[[Config], Learner], tmp_path: Path
) -> None:
    cfg = make_config(model={"base": tiny_model_dir}, artifacts={"store": "file", "keep_versions": 2})
    learner = started(cfg)
    events = [learner.publish() for _ in range(3)]
    assert not adapter_dir(cfg, 1).exists()
    for event in events[1:]:  # what a file:// server fetches is there, whole
        assert event is not None
        fetched = fetch(
            event.adapter_uri, tmp_path / f"v{event.version}", sha256=event.sha256, size_bytes=event.size_bytes
        )
        assert sha256_dir(fetched) == event.sha256


def test_a_wandb_project_gets_the_learners_updates_versions_and_metrics_in_an_offline_run(
    learner_config: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monitor = MonitorConfig(wandb_project="distrl-test", wandb_mode="offline", wandb_dir=tmp_path)
    cfg = learner_config(updates_per_version=2).model_copy(update={"monitor": monitor})
    learner = Learner(cfg)
    learner.start()
    try:
        running = Running(learner)
        produce(cfg, sim_events(learner.trainer.tokenizer, 2, seed=1, version=0))
        running.wait_for("version 1", lambda: learner.version == 1)
        running.finish()
    finally:
        learner.close()
    [(name, (run, rows))] = offline_runs(tmp_path).items()
    assert name == f"{cfg.run}-{learner.member_id}" and run.job_type == "learner" and run.run_group == cfg.run
    updates = {row["_step"]: row for row in rows if any(key.startswith("update/") for key in row)}
    assert {1, 2} <= set(updates) and all(isinstance(row["update/loss_policy"], float) for row in updates.values())
    # The loop may publish again between the wait and the stop: every version has its row, at its update.
    versions = [(row["version/version"], row["_step"]) for row in rows if "version/version" in row]
    assert versions == [(v, 2 * v) for v in range(1, learner.version + 1)], versions
    assert any(row.get("learner/versions_published") == learner.version for row in rows)  # the final metric window


# A minute of collection gives the learner enough BrowserGym episodes for several updates and a version; how many the
# collector finishes depends on the machine (about a dozen on 2 busy cores), so only a floor is asserted.
BROWSERGYM_COLLECTION_S = 60.0
BROWSERGYM_MIN_EPISODES = 6


@pytest.mark.browser
@pytest.mark.vllm
def test_a_minute_of_browsergym_miniwob_collection_is_all_ingested_and_trained_on_with_no_dead_letter(
    make_config: Callable[..., Config], started: Callable[[Config], Learner], vllm_server: VllmService
) -> None:
    # Pages whose prompts fit the tiny model's 512-token context with room for every candidate (at most ~230 of its
    # tokens); click-button's and click-link's accessibility trees come near or past it, which ends some episodes in an
    # inference error before the pipeline under test is reached.
    names = ("click-test", "click-test-2", "focus-text", "focus-text-2")
    tasks = [f"browsergym/miniwob.{name}" for name in names]
    cfg = make_config(
        model={"base": vllm_server.model_dir},  # the served base is the learner's: its log-probs are comparable
        env={"kind": "browsergym", "browsergym_tasks": tasks},
        inference={"url": vllm_server.url, "request_timeout_s": 20.0},
        collector={"envs": 2, "duration_s": BROWSERGYM_COLLECTION_S, "metrics_interval_s": 5.0},
        learner={
            "batch_episodes": 2,
            "min_buffer_episodes": 2,
            "updates_per_version": 2,
            # Updates only as fast as episodes arrive: an unpaced learner would take a core from the browsers.
            "max_replay_ratio": 1.0,
            "checkpoint_interval_updates": 1000,
            "priority_refresh_interval": 1000,
            # No weight watcher: the server acts at version 0 throughout, however many versions the learner publishes.
            "drop_above_policy_lag": 1_000_000,
        },
    )
    learner = started(cfg)
    running = Running(learner)
    report = asyncio.run(asyncio.wait_for(Collector(cfg).run(), BROWSERGYM_COLLECTION_S + 90))

    assert report.failure is None and report.publish_failures == 0 and report.undelivered == 0, report.summary()
    assert report.delivered == report.published >= BROWSERGYM_MIN_EPISODES, report.summary()
    events = [decode(m.value(), TrajectoryEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories)]
    assert len(events) == report.delivered
    for event in events:
        assert event.env_kind == "browsergym" and event.task_template in tasks
        assert event.termination in (Termination.SUCCESS, Termination.FAILURE, Termination.TRUNCATED)
        # Chosen among the candidates, in BrowserGym's call syntax (the Selenium adapter's are JSON objects).
        assert event.steps and all(s.action_text in s.candidates and s.action_text.endswith(")") for s in event.steps)
    running.wait_for(
        "every episode ingested and a version published",
        lambda: learner.counters.ingested == len(events) and learner.counters.published >= 1,
    )
    running.finish()
    counters = learner.counters
    assert (counters.dead, counters.incomplete, counters.stale, counters.rejected) == (0, 0, 0, 0)
    assert not list(read_topic(cfg.kafka, TopicNames(cfg.run).dlq))
    assert learner.trainer.updates >= 2 and [e.version for e in weight_events(cfg)][:1] == [1]
