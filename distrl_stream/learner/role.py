"""The learner role: ingest → replay buffer → updates → weight versions, with checkpoints and metrics.

::

    learner = Learner(cfg)           # nothing starts yet
    learner.start()                  # restore the last checkpoint (or warm start), join the group
    learner.run(stop_event)          # until stop_event is set or learner.max_updates; then a final checkpoint
    learner.close()

The loop (one thread; the Kafka reader has its own, :mod:`.ingest`):

1. take whatever the reader has decoded (never waiting on it), drop what is stale (more than
   ``drop_above_policy_lag`` versions behind) or incomplete, put the rest in the replay buffer, and write every
   record to the ingest log;
2. when the buffer holds ``min_buffer_episodes`` (async, and within ``max_replay_ratio``) — or, in round mode, when
   ``round_episodes`` attempts of the current round arrived (usable or not, :mod:`distrl_stream.pacing`) — do an
   update (:class:`~distrl_stream.learner.trainer.Trainer`); after a restart, only once the checkpoint's replay
   shard has been re-read whole (a checkpoint before would lose the rest of it);
3. every ``updates_per_version`` updates (in round mode: at the end of each round) write the adapter to the artifact
   store and THEN publish a WeightVersionEvent on ``{run}.weights``; the store keeps the newest
   ``artifacts.keep_versions`` versions;
4. every ``checkpoint_interval_updates`` updates, and on stop, write an atomic checkpoint and commit its offsets;
5. every ``metrics_interval_s`` publish a MetricEvent (role ``learner``) on ``{run}.metrics``.

In a learner group (:mod:`.group`, started by torch's elastic agent) every member runs this loop on its own
partitions and replay shard; the members decide together whether to update, average their gradients, and rank 0
alone publishes versions and writes the group's checkpoints.

Version numbers never repeat: after a restart the counter continues from the larger of the checkpoint's and the
newest adapter in the artifact store (a version published after the last checkpoint keeps its number).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl_stream import pacing
from distrl_stream.artifacts import (
    adapter_dir,
    atomic_dir,
    base_fingerprint,
    newest_artifact_version,
    prune_artifacts,
    publish,
    version_event,
)
from distrl_stream.config import Algorithm, Config
from distrl_stream.errors import (
    ArtifactUploadError,
    CheckpointError,
    DeliveryError,
    KafkaClientError,
    LearnerError,
    ReplayBufferError,
)
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, utc_now
from distrl_stream.kafka import KafkaError, Message
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointStore,
    IngestLog,
    checkpoints_dir,
    learner_dir,
    member_logs,
    read_json,
    write_json,
)
from distrl_stream.learner.device import resolve_device
from distrl_stream.learner.group import Group, MemberLock, Membership
from distrl_stream.learner.ingest import INCOMPLETE_TERMINATIONS, Entry, EntryKind, TrajectoryReader, entry_from_message
from distrl_stream.learner.metrics import Counters, LearnerMetrics
from distrl_stream.learner.records import EpisodeRecord, episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from distrl_stream.monitor.tensorboard import ScalarWriter, scalar_writer
from distrl_stream.monitor.wandb import Tracker, tracker
from distrl_stream.policy.model_dir import reads_screenshots, resolve_model_dir
from distrl_stream.policy.precision import Precision, resolve_precision

log = logging.getLogger(__name__)

# Update statistics copied into each WeightVersionEvent's metrics summary.
_SUMMARY_KEYS = ("loss_policy", "loss_critic", "entropy", "rho_mean", "value_error", "batch_success")
# Seconds a read of another run's trajectories (--from-replay, and its episodes re-read after a restart) may take.
_REPLAY_READ_TIMEOUT_S = 300.0


@dataclass
class _Window:
    """Measurements between two metric events."""

    started: float = field(default_factory=time.monotonic)
    updates: int = 0
    stats: dict[str, list[float]] = field(default_factory=dict)
    lags: list[int] = field(default_factory=list)

    def add(self, stats: dict[str, float]) -> None:
        self.updates += 1
        for k, v in stats.items():
            self.stats.setdefault(k, []).append(v)

    def means(self) -> dict[str, float]:
        return {k: float(np.mean(v)) for k, v in self.stats.items()}


class Learner:
    """One member of the learner group ``{run}.learner`` (see the module docstring); its rank comes from the
    elastic agent's environment (:class:`~.group.Membership`), rank 0 when started alone.

    Args:
        cfg: the configuration (``learner``, ``model``, ``inference.temperature``, ``kafka``, ``run``, ``data_dir``).
        model_dir: the base model folder; default what the server serves (``model.base`` or the local model,
            built on first use).
    """

    def __init__(self, cfg: Config, *, model_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.settings = cfg.learner
        self.membership = Membership.from_env()
        self.member_id = self.membership.member_id
        self.topics = TopicNames(cfg.run)
        self.dir = learner_dir(cfg.run_dir, self.member_id)
        self.store = CheckpointStore(checkpoints_dir(cfg.run_dir), cfg.learner.checkpoint_keep)
        self.lock = MemberLock(self.dir, f"learner member {self.member_id} of run {cfg.run!r}")
        self.ingest_log = IngestLog(self.dir / "ingested.log")
        self.counters = Counters()
        # The one record of the current policy version: the number of the newest version rank 0 published (or found
        # in the artifact store at start); lags and round mode are measured from it.
        self.version = 0
        self.precision: Precision = "float32"  # the forward passes' precision, decided at start
        self._running_since: float | None = None  # when run() began
        self._idle_s = 0.0  # seconds run() waited for data since
        # Each member samples its own shard with its own generator.
        self.buffer = ReplayBuffer(
            cfg.learner.buffer_capacity_steps, cfg.learner.dper_alpha, seed=cfg.learner.seed + self.membership.rank
        )
        self.group = Group(self.membership, torch.device("cpu"))
        self.restored_from: Path | None = None
        self._model_dir = model_dir
        self._trainer: Trainer | None = None
        self._reader: TrajectoryReader | None = None
        self._producer: Producer | None = None
        self._metrics_producer: Producer | None = None
        self._base_fingerprint = ""
        self._start_offsets: dict[int, int] = {}
        self._shard_from: dict[int, int] = {}  # partition -> first offset of the checkpoint's shard
        self._shard_rebuilt: set[int] = set()  # partitions of that shard some member has re-read whole since start
        self._restore_priorities: dict[tuple[int, int], float] = {}  # (partition, offset) -> priority, to rebuild
        # Buffer key -> (topic, partition, offset) of its record: this run's trajectories, or a --from-replay source.
        self._origins: dict[int, tuple[str, int, int]] = {}
        self._log_lengths: dict[str, int] = {}  # member -> ingest log length, as the last checkpoint recorded
        self._generation = ""
        self._window = _Window()
        self._last_stats: dict[str, float] = {}
        self._round_new = 0  # round mode: attempts of the current round read (_of_this_round)
        self._round_updates_left = 0
        # The replay cap counts what the collectors' rate limit counts (distrl_stream.pacing): every record of the
        # topic, usable or not, over the whole run: those before this start (the checkpoint's offsets, and episodes
        # loaded from another run) and those the group's members read since (summed over the members at each
        # exchange; a member reads only its own partitions).
        self._records_before = 0
        self._records_read = 0  # this member's, since it started
        self._group_read = 0  # every member's since they started, as of the last exchange
        self._dirty = False  # something happened since the last checkpoint
        self._tensorboard: ScalarWriter | None = None
        self._wandb: Tracker | None = None
        self.prometheus = LearnerMetrics(
            cfg.run,
            self.member_id,
            lambda: self.counters,
            version=lambda: self.version,
            updates=lambda: self._trainer.updates if self._trainer is not None else None,
            buffer=lambda: (len(self.buffer), self.buffer.num_steps, self.buffer.num_steps / self.buffer.capacity),
            consumer_lag=lambda: self._reader.lag if self._reader is not None else None,
            ingest_queue=lambda: self._reader.queued if self._reader is not None else None,
            prompt_ids=lambda: (
                (self._trainer.prompt_ids_checked, self._trainer.prompt_ids_mismatched) if self._trainer else (0, 0)
            ),
        )

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def trainer(self) -> Trainer:
        """The trainer (after :meth:`start`)."""
        if self._trainer is None:
            raise LearnerError("learner not started: call start() first")
        return self._trainer

    def start(
        self, *, from_replay: str | None = None, replay_updates: int = 0, replay_algorithm: Algorithm = "bc"
    ) -> None:
        """Restore the last checkpoint, or start fresh (optionally pre-training offline on another run's topic).

        Args:
            from_replay: a run whose ``{run}.trajectories`` to pre-train on (read by assign + offsets, never joining
                a group); ignored when resuming from a checkpoint (the checkpoint already holds its effect, and the
                replayed episodes its shard held are re-read from their topic).
            replay_updates: updates of the offline phase.
            replay_algorithm: the offline update rule (``bc`` clones every replayed episode).

        Raises:
            CheckpointError: the latest checkpoint is unusable.
            LearnerError: a bad warm-start adapter, a replay topic with no usable episodes, a replay topic the
                checkpoint's shard holds episodes of that cannot be read, or a ``learner.device`` of ``cuda`` without a
                GPU for every member on this host.
        """
        if self.settings.threads:
            torch.set_num_threads(self.settings.threads)
        self.device = resolve_device(self.settings.device, self.membership)
        if self.membership.world_size > 1 and self._round_mode():
            raise LearnerError("learner.round_episodes: round mode needs a single learner member (--nproc-per-node 1)")
        self.lock.acquire()
        self.precision = resolve_precision(self.settings.dtype, self.device.type, role="learner")
        # One scalar log for the group: the writer's (every member's numbers are on {run}.metrics with its rank).
        if self.settings.tensorboard_dir is not None and self.membership.writer:
            self._tensorboard = scalar_writer(self.settings.tensorboard_dir, "learner.tensorboard_dir")
        if self.membership.writer:
            self._wandb = tracker(self.cfg, "learner", self.member_id)
        # Members on one host each need a port of their own: the configured one plus the local rank.
        port = self.settings.metrics_port
        self.prometheus.serve(port + self.membership.local_rank if port else port, "learner.metrics_port")
        self.group = Group(self.membership, self.device)
        self.group.start()
        if self.membership.writer:
            ensure_run_topics(self.cfg)
        self._producer = Producer(self.cfg.kafka, client_id=f"learner-{self.member_id}")
        # Metrics are best-effort and never flushed: on a producer of their own, a lost one is counted and logged
        # but cannot fail the flush of a publish.
        self._metrics_producer = Producer(self.cfg.kafka, client_id=f"learner-{self.member_id}-metrics")
        model_dir = self._model_dir or resolve_model_dir(self.cfg)
        self._model_dir = model_dir
        # Every member: its versions carry it (the writer's) and its ingest checks episodes against it.
        self._base_fingerprint = base_fingerprint(self.cfg, model_dir)
        # Rank 0 decides, so every member resumes from the same checkpoint within the same generation.
        checkpoint, self._generation = self.group.broadcast((self.store.latest(), uuid.uuid4().hex))
        if self.membership.writer:
            self._truncate_logs(checkpoint)
        self.group.exchange([0.0])  # nobody appends to an ingest log before rank 0 has cut them all
        if checkpoint is not None:
            self._restore(checkpoint, model_dir)
            return
        torch.manual_seed(self.settings.seed)  # a fresh adapter's LoRA A matrices are drawn here: `learner.seed` too
        model, tokenizer = load_policy(
            model_dir,
            self.cfg.model,
            self.settings.init_adapter,
            self.device,
            self.precision,
            vision=reads_screenshots(self.cfg, model_dir),
        )
        self._trainer = self._new_trainer(model, tokenizer)
        self.version = self.group.broadcast(newest_artifact_version(self.cfg))
        if self.settings.init_adapter is None and self.version == 0:
            self._trainer.mark_version(0)  # a fresh adapter is the base model, which serves as version 0
        if from_replay is not None:
            self.pretrain(from_replay, replay_updates, replay_algorithm)
        if self.settings.init_adapter is not None or from_replay is not None:
            self.publish()
            self.checkpoint()

    def _new_trainer(self, model: Any, tokenizer: Any) -> Trainer:
        trainer = Trainer(
            self.settings,
            model,
            tokenizer,
            self.buffer,
            temperature=self.cfg.inference.temperature,
            grad_sync=self.group.average_gradients if self.group.distributed else None,
            precision=self.precision,
        )
        # Identical weights on every member from the start (a fresh LoRA's A matrices are random).
        self.group.broadcast_parameters([*trainer.policy_params, *trainer.critic_params])
        return trainer

    def _truncate_logs(self, checkpoint: Path | None) -> None:
        """Cut every member's ingest log back to the checkpoint (rank 0, before any member ingests): what was used
        after it is used again, by whichever member owns its partition now."""
        recorded = read_json(checkpoint / "state.json").get("ingest_logs", {}) if checkpoint is not None else {}
        for member, path in member_logs(self.cfg.run_dir).items():
            IngestLog(path).truncate(int(recorded.get(member, 0)))
        self._log_lengths = {m: int(n) for m, n in recorded.items()}

    def _restore(self, checkpoint: Path, model_dir: Path) -> None:
        state = read_json(checkpoint / "state.json")
        if state.get("format") != CHECKPOINT_FORMAT or state.get("run") != self.cfg.run:
            raise CheckpointError(
                f"checkpoint {checkpoint} is format {state.get('format')!r} of run {state.get('run')!r}; "
                f"expected format {CHECKPOINT_FORMAT} of run {self.cfg.run!r}"
            )
        model, tokenizer = load_policy(
            model_dir,
            self.cfg.model,
            checkpoint / "adapter",
            self.device,
            self.precision,
            vision=reads_screenshots(self.cfg, model_dir),
        )
        trainer = self._new_trainer(model, tokenizer)
        try:
            trainer.load_state_dict(torch.load(checkpoint / "trainer.pt", weights_only=True))
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint}: trainer state unusable: {exc}") from None
        self._trainer = trainer
        self._start_offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        shards = state["shards"]
        self._shard_from = {int(p): int(shard["from"]) for p, shard in shards.items()}
        self._restore_priorities = {
            (int(p), int(o)): float(v) for p, shard in shards.items() for o, v in shard["priorities"].items()
        }
        # The group's counters continue on rank 0; the other members count from zero what they do from now on.
        if self.membership.writer:
            self.counters = Counters(**state["counters"])
        # First in the buffer, as when they were loaded. Checkpoints from before they were recorded lack the key.
        self._restore_replayed(state.get("replayed", {}))
        self.version = self.group.broadcast(max(int(state["version"]), newest_artifact_version(self.cfg)))
        # Every record before the checkpoint's offsets was read, and the replayed episodes count as read too.
        self._records_before = sum(self._start_offsets.values()) + int(state["counters"].get("replayed", 0))
        self._round_new = int(state.get("round_new", 0))
        self._round_updates_left = int(state.get("round_updates_left", 0))
        self.restored_from = checkpoint
        log.info(
            "learner %s resumed from %s: update %d, version %d, offsets %s, %d shard records to re-read",
            self.member_id,
            checkpoint.name,
            trainer.updates,
            self.version,
            self._start_offsets,
            len(self._restore_priorities),
        )

    def run(self, stop: threading.Event | None = None) -> None:
        """Ingest and train until ``stop`` is set or ``max_updates`` is reached, then write a final checkpoint.

        Raises:
            LearnerError: the Kafka reader failed (its cause is chained).
        """
        stop = stop or threading.Event()
        trainer = self.trainer
        limit = self.settings.max_updates
        if limit and trainer.updates >= limit:
            log.info("learner %s: max_updates=%d already reached", self.member_id, limit)
            return
        self._reader = TrajectoryReader(
            self.cfg,
            self.member_id,
            self._start_offsets,
            shard_from=self._shard_from,
            generation=self._generation,
            convert=self._convert,
            solo=self.membership.world_size == 1,
        )
        self._reader.start()
        self._window = _Window()
        self._running_since, self._idle_s = time.monotonic(), 0.0
        clean = False
        try:
            while True:
                if self._reader.failed is not None:
                    raise LearnerError(f"trajectory reader failed: {self._reader.failed}") from self._reader.failed
                self._ingest(self._reader.drain(512))
                ready = self._should_update()
                unread = sorted(self._shard_from.keys() - self._shard_rebuilt)  # the same list on every member
                rebuilt = self._reader.rebuilt()
                # One collective per iteration on every member: update if any can, stop if any must; and which
                # partitions of the checkpoint's shard some member has finished re-reading.
                # Each member's records read in its own slot: the element-wise maximum then holds all of them.
                reads = [0.0] * self.membership.world_size
                reads[self.membership.rank] = float(self._records_read)
                go, stopping, version, *rest = self.group.exchange(
                    [
                        float(ready),
                        float(stop.is_set()),
                        float(self.version),
                        *reads,
                        *(float(p in rebuilt) for p in unread),
                    ]
                )
                self._group_read, done = int(sum(rest[: len(reads)])), rest[len(reads) :]
                if int(version) > self.version:  # a version rank 0 published: these are its weights too
                    self.trainer.mark_version(int(version))
                self.version = max(self.version, int(version))
                self._shard_rebuilt.update(p for p, d in zip(unread, done, strict=True) if d)
                if stopping:
                    break
                if go:
                    self._update_once(contribute=ready)
                    if limit and trainer.updates >= limit:
                        log.info("learner %s: max_updates=%d reached", self.member_id, limit)
                        break
                else:
                    self._wait_for_data()
                if time.monotonic() - self._window.started >= self.settings.metrics_interval_s:
                    self.emit_metrics()
            clean = True
        finally:
            # Only a clean stop checkpoints here: after a failure the last periodic checkpoint is the safe one.
            if clean:
                if self._shard_whole():
                    self.checkpoint()
                else:  # it would hold only the part of the shard re-read so far: the last checkpoint stands
                    log.warning("learner %s: stopped before its shard was re-read: no checkpoint", self.member_id)
                self.emit_metrics(final=True)
            self._reader.stop()
            self._reader = None

    def parameter_hash(self) -> str:
        """sha256 of the trainable parameters (LoRA and critics): equal on every member of a group."""
        digest = hashlib.sha256()
        for p in [*self.trainer.policy_params, *self.trainer.critic_params]:
            digest.update(p.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()

    def close(self) -> None:
        """Flush the producer, close the ingest log, leave the process group, release the member's lock
        (idempotent)."""
        self.ingest_log.close()
        self.prometheus.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None
        for producer in (self._producer, self._metrics_producer):
            if producer is not None:
                producer.close()
        self._producer = self._metrics_producer = None
        self.group.close()
        self.lock.release()

    # -- ingest --------------------------------------------------------------------------------------------------

    def _convert(self, event: TrajectoryEvent) -> EpisodeRecord:
        """:func:`episode_from_event` for this learner: acted by its base model, with choice-mode tokens its
        policy's choice constraint accepts, token ids inside its vocabulary and, for a vision policy, screenshots that
        read back as recorded, with as many image tokens in its prompt ids as they fill (else an update or a priority
        refresh could not compute log π on it). Runs on the reader's thread."""
        episode = episode_from_event(
            event,
            base_model=self.cfg.model.base_model_id,
            base_fingerprint=self._base_fingerprint,
            check_action=self.trainer.constraint.allowed,
            screenshots=self.trainer.prompter.vision,
            vocab_size=self.trainer.vocab_size,
        )
        self.trainer.check_image_tokens(episode)
        return episode

    def _ingest(self, entries: list[Entry]) -> None:
        assert self._reader is not None
        for entry in entries:
            if not self._reader.accept(entry):
                continue  # its partition was revoked since: whoever holds it now reads it from our hand-over
            if entry.rebuild:
                self._rebuild(entry)
                continue
            self._dirty = True
            self._records_read += 1
            if self._round_mode() and self._of_this_round(entry):
                self._round_new += 1
            if entry.kind is EntryKind.ATTEMPT:
                self.counters.incomplete += 1
                self.ingest_log.append(entry.partition, entry.offset, entry.episode_id, "incomplete")
                continue
            if entry.kind is EntryKind.DEAD or entry.episode is None:
                self.counters.dead += 1
                self.ingest_log.append(entry.partition, entry.offset, entry.episode_id, "dead")
                continue
            episode = entry.episode
            status = self._admit(episode, entry.termination in INCOMPLETE_TERMINATIONS, (entry.partition, entry.offset))
            self.ingest_log.append(entry.partition, entry.offset, entry.episode_id, status)

    def _of_this_round(self, entry: Entry) -> bool:
        """Whether a record counts towards the round: an episode acted by the current version, usable or not, or an
        attempt whose version nothing tells (one that failed before its first step, an undecodable record). Counting
        those means a lost attempt costs the round its data, never the collectors a ``sync_version_timeout_s``
        wait."""
        if entry.episode is not None:
            return all(s.policy_version == self.version for s in entry.episode.steps)
        return all(v == self.version for v in entry.versions)

    def _rebuild(self, entry: Entry) -> None:
        """Put a record of the checkpoint's shard back in the buffer at its priority."""
        priority = self._restore_priorities.pop((entry.partition, entry.offset), None)
        if priority is not None:  # else not held by the shard (dropped, evicted) when the checkpoint was written
            self._put_back(self.topics.trajectories, entry, priority)

    def _put_back(self, topic: str, entry: Entry, priority: float) -> None:
        """Put a record a checkpoint's shard held back in the buffer at its priority (no log line, no ingest
        counter: it was ingested before the checkpoint)."""
        if entry.episode is None:
            # Held before a check that refuses it now: leave it out rather than meet it again at the next update.
            self.counters.rejected += 1
            log.warning("%s[%d]@%d not restored to the buffer: %s", topic, entry.partition, entry.offset, entry.reason)
            return
        try:
            key = self.buffer.add(entry.episode)
        except ReplayBufferError:
            return
        self._origins[key] = (topic, entry.partition, entry.offset)
        self.buffer.update_priorities([key], [priority])

    def _admit(self, episode: EpisodeRecord, incomplete: bool, origin: tuple[int, int]) -> str:
        """Put one episode in the buffer unless it is incomplete or stale; returns its ingest-log status."""
        if incomplete:
            self.counters.incomplete += 1
            return "incomplete"
        lags = [self.version - s.policy_version for s in episode.steps]
        if max(lags) > self.settings.drop_above_policy_lag:
            self.counters.stale += 1
            return "stale"
        try:
            key = self.buffer.add(episode)
        except ReplayBufferError as exc:
            log.warning("episode %s refused by the replay buffer: %s", episode.episode_id, exc)
            self.counters.rejected += 1
            return "rejected"
        self._origins[key] = (self.topics.trajectories, *origin)
        # Counted once per episode ingested, on this thread (a rebuild from the checkpoint's shard is not counted).
        self.trainer.check_prompt_ids(episode)
        self._window.lags.extend(lags)
        for lag in lags:
            self.prometheus.policy_lag.observe(lag)
        self.counters.ingested += 1
        return "ingested"

    # -- updates, versions, checkpoints --------------------------------------------------------------------------

    def _round_mode(self) -> bool:
        return self.settings.round_episodes > 0

    def _shard_whole(self) -> bool:
        """Whether the group has re-read every partition of the checkpoint's replay shard (the same answer on every
        member: it comes from the collective exchange)."""
        return self._shard_rebuilt.issuperset(self._shard_from)

    def _should_update(self) -> bool:
        # No update, and so no checkpoint, before the shard is whole: a checkpoint would keep only what was re-read.
        if not self._shard_whole() or not self.trainer.ready():
            return False
        if not self._round_mode():
            return pacing.may_update(
                self.trainer.updates,
                self._records_total(),
                batch_episodes=self.settings.batch_episodes,
                max_replay_ratio=self.settings.max_replay_ratio,
            )
        if self._round_updates_left == 0 and pacing.round_complete(self._round_new, self.settings.round_episodes):
            self._round_updates_left = self.settings.updates_per_version
        return self._round_updates_left > 0

    def _records_total(self) -> int:
        """Records of the topic the learner (every member) has read over the run, usable or not."""
        since = self._group_read if self.membership.world_size > 1 else self._records_read
        return self._records_before + since

    def replay_ratio(self) -> float:
        """Episodes sampled per record read, over the run (what ``max_replay_ratio`` caps)."""
        return self.trainer.updates * self.settings.batch_episodes / max(self._records_total(), 1)

    def _wait_for_data(self) -> None:
        """Wait a moment for trajectories, counted as idle time (``idle_s``: the learner starved of data)."""
        assert self._reader is not None
        started = time.monotonic()
        self._reader.wait(0.2)
        self._idle_s += time.monotonic() - started

    def _update_once(self, *, contribute: bool = True) -> None:
        trainer = self.trainer
        stats = trainer.update(version=self.version, contribute=contribute)
        if stats is not None:
            self._window.add(stats)
            self._last_stats = stats
            self.prometheus.update(stats)
            if self._wandb is not None:
                self._wandb.log("update", stats, step=trainer.updates)
            self._dirty = True
        elif self._reader is not None:
            # Nothing to learn from yet (e.g. filtered BC before the first success): let data arrive.
            self._wait_for_data()
        if self._round_mode():
            # Every attempt counts, so a round always ends in a version and synchronous collectors never wait in vain.
            self._round_updates_left -= 1
            if self._round_updates_left == 0:
                self._round_new = 0
                self._publish_through_outages()
        elif stats is not None and trainer.updates % self.settings.updates_per_version == 0:
            self._publish_through_outages()
        if stats is not None and trainer.updates % self.settings.checkpoint_interval_updates == 0:
            self.checkpoint()

    def publish(self) -> WeightVersionEvent | None:
        """Write the current adapter as the next version (atomically), put it in ``artifacts.store``, and THEN
        announce it (rank 0; the other members learn the number in the next :meth:`~.group.Group.exchange`); then
        remove the versions older than the newest ``artifacts.keep_versions`` from the artifact folder.

        Returns:
            The published event (None on members other than rank 0).

        Raises:
            KafkaClientError: the chunks or the event were not acknowledged (the artifact stays; the next publish
                takes the next number).
            ArtifactUploadError: the object store refused the upload, retries included (the artifact stays; the
                next publish takes the next number).
        """
        assert self._producer is not None
        if not self.membership.writer:
            return None
        version = max(self.version, newest_artifact_version(self.cfg)) + 1
        target = adapter_dir(self.cfg, version)
        with atomic_dir(target) as tmp:
            self.trainer.save_adapter(tmp)
        # The adapter reaches the store (Kafka, an object store) before the event that names it.
        uri = publish(self.cfg, version, target, self._producer)
        event = version_event(
            self.cfg.model,
            version,
            target,
            adapter_uri=uri,
            base_fingerprint=self._base_fingerprint,
            learner_step=self.trainer.updates,
            trajectories_consumed=self.counters.ingested,
            metrics={k: self._last_stats[k] for k in _SUMMARY_KEYS if k in self._last_stats},
        )
        self._producer.produce_event(self.topics.weights, event)
        self._producer.flush()
        self.version = version
        self.trainer.mark_version(version)
        self.counters.published += 1
        self._dirty = True
        log.info("learner %s published version %d (update %d)", self.member_id, version, self.trainer.updates)
        try:
            prune_artifacts(self.cfg, version)
        except OSError as exc:  # disk space, not correctness: the next publish tries again
            log.warning("learner %s: could not prune old adapter versions: %s", self.member_id, exc)
        if self._wandb is not None:
            published = {"version": float(version), "trajectories_consumed": float(self.counters.ingested)}
            self._wandb.log("version", published, step=self.trainer.updates)
        return event

    def _publish_through_outages(self) -> None:
        """:meth:`publish`, and when the cluster does not acknowledge it or the object store refuses its upload
        (after ``artifacts.upload_retries``), count and log the version and train on: the next publish takes the
        next number, so an outage of either costs versions, not the learner."""
        try:
            self.publish()
        except DeliveryError as exc:  # unacknowledged, not refused: a refused login or record stays fatal
            self.counters.unannounced += 1
            log.warning("learner %s: a version was not announced (training goes on): %s", self.member_id, exc)
        except ArtifactUploadError as exc:  # a malformed adapter folder (any other ArtifactError) stays fatal
            self.counters.not_uploaded += 1
            log.warning("learner %s: a version was not uploaded (training goes on): %s", self.member_id, exc)

    def checkpoint(self) -> Path | None:
        """Write the group's atomic checkpoint (see :mod:`.checkpoint`) and commit each member's offsets.

        Collective in a group: every member calls it at the same update; each contributes its positions, its shard
        and its ingest log's length, and rank 0 writes.

        Returns:
            The checkpoint folder, or None when nothing changed since the last one.
        """
        trainer = self.trainer
        positions: dict[int, int] = {}
        if self._reader is not None:
            # Dead letters below the checkpoint's offsets must be durable before the offsets move past them.
            try:
                self._reader.flush_dead_letters()
            except DeliveryError as exc:
                # A checkpoint is collective (one member skipping it stalls the group), so it goes on, reporting the
                # letters lost; pending ones may still arrive, and the next flush reports them if they fail.
                self.counters.dead_letters_lost += exc.failed
                log.warning("learner %s: dead letters not acknowledged by this checkpoint: %s", self.member_id, exc)
            positions = self._reader.positions()
        self._origins = {k: self._origins[k] for k in self.buffer if k in self._origins}
        mine = {
            "dirty": self._dirty,
            "positions": positions,
            "shard": [(*self._origins[k], self.buffer.priority(k)) for k in self._origins],
            "log_bytes": self.ingest_log.sync(),
            "counters": self.counters.as_dict(),
        }
        members = self.group.gather(mine)
        written = self._write_checkpoint(members) if self.membership.writer else None
        path, offsets = self.group.broadcast(written or (None, None))
        if path is None:
            return None
        self._start_offsets = offsets
        self._dirty = False
        if self._reader is not None:
            self._reader.commit(positions)
        log.info("learner %s: %s at update %d, offsets %s", self.member_id, path.name, trainer.updates, positions)
        return path

    def _write_checkpoint(self, members: list[dict[str, Any]]) -> tuple[Path, dict[int, int]] | None:
        """Rank 0: merge the members' parts and write the checkpoint (None when no member changed anything)."""
        if not any(m["dirty"] for m in members) and self.store.latest() is not None:
            return None
        trainer = self.trainer
        offsets = dict(self._start_offsets)  # partitions no member holds now keep the last checkpoint's offset
        shards: dict[int, dict[int, float]] = {}
        replayed: dict[str, dict[int, dict[int, float]]] = {}
        for m in members:
            for p, o in m["positions"].items():
                offsets[p] = max(offsets.get(p, 0), o)
            for topic, p, o, priority in m["shard"]:
                if topic == self.topics.trajectories:
                    shards.setdefault(p, {})[o] = priority
                else:
                    replayed.setdefault(topic, {}).setdefault(p, {})[o] = priority
        # Logs of members that are gone stay as they were: their lines are part of the group's history.
        self._log_lengths = {**self._log_lengths, **{str(rank): m["log_bytes"] for rank, m in enumerate(members)}}
        counters = {k: sum(m["counters"][k] for m in members) for k in members[0]["counters"]}
        state = {
            "format": CHECKPOINT_FORMAT,
            "run": self.cfg.run,
            "policy_id": self.cfg.model.policy_id,
            "members": len(members),
            "updates": trainer.updates,
            "version": self.version,
            "offsets": {str(p): o for p, o in sorted(offsets.items())},
            "shards": {
                str(p): {"from": min(held), "priorities": {str(o): held[o] for o in sorted(held)}}
                for p, held in sorted(shards.items())
            },
            "replayed": {
                topic: {str(p): {str(o): held[o] for o in sorted(held)} for p, held in sorted(by_partition.items())}
                for topic, by_partition in sorted(replayed.items())
            },
            "ingest_logs": self._log_lengths,
            "counters": counters,
            "round_new": self._round_new,
            "round_updates_left": self._round_updates_left,
            "created_at": utc_now().isoformat(),
        }

        def write(folder: Path) -> None:
            trainer.save_adapter(folder / "adapter")
            torch.save(trainer.state_dict(), folder / "trainer.pt")
            write_json(folder / "state.json", state)

        return self.store.save(write), offsets

    # -- offline pre-training (off-to-on) ------------------------------------------------------------------------

    def load_replay(self, source_run: str, timeout_s: float = _REPLAY_READ_TIMEOUT_S) -> int:
        """Put the usable episodes of ``{source_run}.trajectories`` in the buffer (no group, no offsets kept).

        The episodes go in in the order they were produced (timestamp, then partition and offset), not in the order
        the partitions' fetches happen to interleave: the same topic always gives the same buffer, so an offline
        pass from it is reproducible, and a topic larger than the buffer keeps its newest episodes. (Episodes of one
        millisecond in different partitions fall in partition order; a topic of one partition is replayed exactly.)

        Returns:
            How many episodes were loaded.

        Raises:
            KafkaClientError: the topic cannot be read.
        """
        loaded = 0
        topic = TopicNames(source_run).trajectories
        for entry in self._read_replay(topic, timeout_s):
            if entry.episode is None or entry.termination in INCOMPLETE_TERMINATIONS:
                continue
            try:
                key = self.buffer.add(entry.episode)
            except ReplayBufferError as exc:
                log.warning("replayed episode %s refused: %s", entry.episode_id, exc)
                continue
            # Part of the shard from now on: a restart re-reads it from the source topic (_restore_replayed).
            self._origins[key] = (topic, entry.partition, entry.offset)
            loaded += 1
        self.counters.replayed += loaded
        self._records_before += loaded
        self._dirty = True
        log.info("loaded %d episodes from %s", loaded, topic)
        return loaded

    def _read_replay(self, topic: str, timeout_s: float = _REPLAY_READ_TIMEOUT_S) -> list[Entry]:
        """Every record of another run's ``topic`` as an entry, in the order they were produced (timestamp, then
        partition and offset); another run's bad records are not ours to dead-letter."""
        messages = sorted(
            read_topic(self.cfg.kafka, topic, timeout_s=timeout_s),
            key=lambda msg: (msg.timestamp()[1], msg.partition(), msg.offset()),
        )
        return [entry_from_message(msg, None, self._convert) for msg in messages]

    def _restore_replayed(self, replayed: dict[str, dict[str, dict[str, float]]]) -> None:
        """Put the replayed episodes a checkpoint's shard held back in the buffer at their priorities, re-read from
        their source topics (``replayed``: topic -> partition -> offset -> priority, as :meth:`checkpoint` writes).

        Raises:
            LearnerError: a source topic cannot be read.
        """
        for topic, partitions in replayed.items():
            held = {(int(p), int(o)): float(v) for p, by_offset in partitions.items() for o, v in by_offset.items()}
            try:
                entries = self._read_replay(topic)
            except KafkaClientError as exc:
                raise LearnerError(f"the checkpoint's replayed episodes cannot be re-read from {topic}: {exc}") from exc
            for entry in entries:
                priority = held.pop((entry.partition, entry.offset), None)
                if priority is not None:
                    self._put_back(topic, entry, priority)
            if held:
                log.warning("%d replayed records of the checkpoint's shard are gone from %s", len(held), topic)

    def pretrain(self, source_run: str, updates: int, algorithm: Algorithm = "bc") -> None:
        """Offline phase: load ``source_run``'s trajectories and do ``updates`` updates of ``algorithm`` on them.

        Raises:
            LearnerError: the topic held no usable episode.
        """
        if self.load_replay(source_run) == 0:
            topic = TopicNames(source_run).trajectories
            raise LearnerError(f"--from-replay {source_run}: {topic} holds no usable episode")
        done = 0
        attempts = 0
        while done < updates and attempts < 2 * updates + 10:
            attempts += 1
            stats = self.trainer.update(algorithm, version=self.version)
            if stats is not None:
                done += 1
                self._window.add(stats)
                self._last_stats = stats
        if done < updates:
            raise LearnerError(f"offline {algorithm}: only {done} of {updates} updates possible on {source_run}'s data")
        self.emit_metrics()
        log.info("pre-trained %d %s updates on %s", done, algorithm, source_run)

    # -- metrics -------------------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The current metric values (averages of the updates since the last emission, counters, buffer, lag)."""
        trainer = self.trainer
        window = self._window
        elapsed = max(time.monotonic() - window.started, 1e-9)
        lags = np.asarray(window.lags, dtype=float)
        values: dict[str, float] = {
            **window.means(),
            **self.buffer.stats(),
            "version": float(self.version),
            "updates": float(trainer.updates),
            "updates_per_s": window.updates / elapsed,
            "replay_ratio": self.replay_ratio(),
            "trajectories_ingested": float(self.counters.ingested),
            "trajectories_dropped_stale": float(self.counters.stale),
            "trajectories_dropped_incomplete": float(self.counters.incomplete),
            "trajectories_dead_lettered": float(self.counters.dead),
            "trajectories_rejected": float(self.counters.rejected + trainer.rejected),
            "prompt_ids_checked": float(trainer.prompt_ids_checked),
            "prompt_ids_mismatched": float(trainer.prompt_ids_mismatched),
            "trajectories_replayed": float(self.counters.replayed),
            "versions_published": float(self.counters.published),
            "versions_unannounced": float(self.counters.unannounced),
            "versions_not_uploaded": float(self.counters.not_uploaded),
            "metric_events_lost": float(self.counters.metrics_lost),
            "dead_letters_lost": float(self.counters.dead_letters_lost),
            "policy_lag_mean": float(lags.mean()) if lags.size else 0.0,
            "policy_lag_p95": float(np.percentile(lags, 95)) if lags.size else 0.0,
            "policy_lag_max": float(lags.max()) if lags.size else 0.0,
            "feature_cache_hit_rate": trainer.features.hits / max(trainer.features.hits + trainer.features.misses, 1),
            # Since run() began: how long the learner waited for data with nothing to update on.
            "running_s": time.monotonic() - self._running_since if self._running_since is not None else 0.0,
            "idle_s": self._idle_s,
        }
        if self._reader is not None:
            values["ingest_queue"] = float(self._reader.queued)
        if self._round_mode():
            values["round_trajectories"] = float(self._round_new)
        return values

    def emit_metrics(self, *, final: bool = False) -> MetricEvent:
        """Publish :meth:`metrics` on ``{run}.metrics`` and start a new measurement window."""
        assert self._metrics_producer is not None
        labels = {
            "algorithm": self.settings.algorithm,
            "policy_id": self.cfg.model.policy_id,
            "rank": self.member_id,
            "members": str(self.membership.world_size),
        }
        if final:
            labels["event"] = "final"
        event = MetricEvent(
            run=self.cfg.run,
            role="learner",
            source_id=self.member_id,
            timestamp=utc_now(),
            values=self.metrics(),
            labels=labels,
        )
        self._metrics_producer.produce_event(self.topics.metrics, event, on_delivery=self._metric_delivered)
        if self._tensorboard is not None:
            self._tensorboard.add_scalars(event.values, self.trainer.updates)
        if self._wandb is not None:
            self._wandb.log("learner", event.values, step=self.trainer.updates)
        self._window = _Window()
        return event

    def _metric_delivered(self, err: KafkaError | None, msg: Message) -> None:
        # Runs inside the metrics producer's poll, on the thread that emits metrics.
        if err is not None:
            self.counters.metrics_lost += 1
            log.warning("learner %s: a metric event was lost: %s", self.member_id, err.str())


def run_learner(cfg: Config, stop: threading.Event, **start_kwargs: Any) -> Learner:
    """Start a learner, run it until ``stop`` (or ``max_updates``), checkpoint, close; the ``learn`` command's body.

    Args:
        cfg: the configuration.
        stop: set it (e.g. from a SIGTERM handler) to end the run cleanly.
        start_kwargs: passed to :meth:`Learner.start` (``from_replay``, ``replay_updates``, ``replay_algorithm``).
    """
    learner = Learner(cfg)
    try:
        learner.start(**start_kwargs)
        if not stop.is_set():
            learner.run(stop)
    finally:
        learner.close()
    return learner
