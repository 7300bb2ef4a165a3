"""The collector process: K environments in one asyncio loop, each episode published as one TrajectoryEvent.

Two modes share every line that touches an environment, the server or Kafka (:meth:`Collector._episode`):

- **async** (DistRL): each of the K env slots loops on its own — sample a task, run the episode with whatever
  version the server serves newest, publish, repeat. Env waits and inference calls of all slots overlap.
- **sync** (DigiRL's multi-machine baseline): rounds. Every env runs one episode on version v (the client is pinned
  to v for the round), the round ends when the last episode ends (barrier), then the collector waits until the server
  serves a version newer than v before the next round.

Lifecycle: :meth:`Collector.request_stop` (SIGTERM/SIGINT in :func:`run_collector`) stops new episodes; in-flight
ones get ``shutdown_grace_s`` to finish, then are cancelled and *abandoned* (never published, counted); a second
request abandons at once. Then the producer is flushed and :meth:`Collector.run` returns a :class:`CollectorReport`.
Errors of the environment or the server end only the episode they hit (see :mod:`.episode`); an error between
episodes (reading the served version or the learner's progress, starting an environment) restarts the slot after a
back-off. Nothing but a stop request ends the collector, or an error retrying cannot cure (refused Kafka credentials,
a bad setting): it stops the collector, whose report names it (:attr:`CollectorReport.failure`), and ``collect``
exits non-zero with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from distrl_stream import pacing
from distrl_stream.artifacts import base_fingerprint
from distrl_stream.collector.episode import EpisodeOutcome, policy_env, run_episode
from distrl_stream.collector.metrics import CollectorMetrics
from distrl_stream.collector.published import PublishedVersions
from distrl_stream.collector.ratelimit import InsertLimiter
from distrl_stream.collector.stats import CollectorStats
from distrl_stream.config import Config
from distrl_stream.envs.base import DeviceEnv
from distrl_stream.envs.factory import make_env
from distrl_stream.envs.seeding import stable_int
from distrl_stream.envs.tasks import TaskSampler, make_sampler
from distrl_stream.errors import (
    ConfigError,
    DistrlError,
    InferenceError,
    KafkaAuthenticationError,
    KafkaClientError,
    RecordRejectedError,
)
from distrl_stream.events import MetricEvent, Step, Termination, TrajectoryEvent, utc_now
from distrl_stream.events.screenshots import ScreenshotStore
from distrl_stream.inference.client import InferenceClient
from distrl_stream.kafka import KafkaError, Message
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.monitor.wandb import Tracker, tracker
from distrl_stream.policy.model_dir import load_prompter, resolve_model_dir

log = logging.getLogger(__name__)

_ERRORS = (Termination.INFERENCE_ERROR, Termination.ENV_ERROR)
_PRODUCER_POLL_S = 0.05
_WAIT_LOG_EVERY_S = 10.0
# Errors that retrying with the same settings cannot cure: they stop the collector instead of a slot's retries.
_FATAL = (ConfigError, KafkaAuthenticationError)


def default_collector_id() -> str:
    """``<hostname>-<pid>``: unique among the processes of one host, readable in metrics."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class CollectorReport:
    """What a collector did, returned when it stops.

    Attributes:
        collector_id: the collector.
        mode: async or sync.
        episodes: episodes that ended (any termination but abandoned).
        by_termination: those episodes per termination.
        published: trajectories handed to the producer.
        delivered: trajectories the broker acknowledged.
        dropped: errored episodes not published (``on_error = "drop"``, or no step done).
        publish_failures: trajectories that could not be queued or whose delivery failed.
        undelivered: trajectories still unacknowledged when the flush timed out (lost).
        abandoned_ids: episodes cut off by shutdown (never published).
        rounds: sync rounds completed (0 in async mode).
        duration_s: wall time of :meth:`Collector.run`.
        stop_reason: why it stopped (signal name, ``max_episodes``, ``duration``, ...).
        failure: the error that stopped a collector that could not work (refused Kafka credentials, a bad setting);
            None when it stopped as asked. ``collect`` exits non-zero with it.
    """

    collector_id: str
    mode: str
    episodes: int
    by_termination: dict[str, int]
    published: int
    delivered: int
    dropped: int
    publish_failures: int
    undelivered: int
    abandoned_ids: tuple[str, ...]
    rounds: int
    duration_s: float
    stop_reason: str
    failure: str | None = None

    @property
    def abandoned(self) -> int:
        """How many episodes were abandoned."""
        return len(self.abandoned_ids)

    def summary(self) -> str:
        """One line for the log / terminal."""
        terms = ", ".join(f"{k} {v}" for k, v in sorted(self.by_termination.items())) or "none"
        abandoned = f"{self.abandoned} abandoned" + (f" ({', '.join(self.abandoned_ids)})" if self.abandoned else "")
        rounds = f", {self.rounds} rounds" if self.mode == "sync" else ""
        return (
            f"collector {self.collector_id} stopped ({self.stop_reason}) after {self.duration_s:.1f}s: "
            f"{self.episodes} episodes ({terms}){rounds}; {self.published} published, {self.delivered} delivered, "
            f"{self.dropped} dropped, {self.publish_failures} publish failures, {self.undelivered} undelivered; "
            f"{abandoned}"
        )


class Collector:
    """One collector process's work: see the module docstring.

    Args:
        cfg: the configuration (sections ``collector``, ``env``, ``inference``, ``kafka``, ``model``, ``run``).
        sampler: where tasks come from; default ``make_sampler(cfg.env, collector.split)`` (uniform, or the
            curriculum of ``env.task_sampler``), seeded by ``env.seed`` and the collector id (collectors sharing a
            run draw different sequences).
        env_factory: makes one environment per slot (and a fresh one after an environment error); default
            ``make_env(cfg.env)``.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        sampler: TaskSampler | None = None,
        env_factory: Callable[[], DeviceEnv] | None = None,
    ) -> None:
        self.cfg = cfg
        self.settings = cfg.collector
        self.collector_id = cfg.collector.collector_id or default_collector_id()
        self.topics = TopicNames(cfg.run)
        self.mode = cfg.inference.mode
        self.stats = CollectorStats()
        self._sampler = sampler
        self._prompter = load_prompter(cfg)
        env_cfg = policy_env(cfg.env, self._prompter)
        self._env_factory = env_factory or (lambda: make_env(env_cfg))
        self._stop_requested = asyncio.Event()
        self._abandon_now = asyncio.Event()
        self._stop_reason = ""
        self._failure: str | None = None
        self._claimed = 0
        self._in_flight: set[str] = set()
        self._paused = False
        self._paused_at = 0.0  # when the current pause began
        self._paused_s = 0.0  # seconds paused before it
        self._served_checked_at = -math.inf
        self._screenshots = ScreenshotStore(cfg.run_dir / "screenshots" / self.collector_id)
        self._producer: Producer | None = None
        self._client: InferenceClient | None = None
        self._published: PublishedVersions | None = None
        self._limiter: InsertLimiter | None = None
        self._base_fingerprint = ""  # of model.base, taken at start; "" for a local model (not built here)
        self._limit_checked_at = -math.inf
        self._wandb: Tracker | None = None
        self.prometheus = CollectorMetrics(
            cfg.run,
            self.collector_id,
            self.stats,
            in_flight=lambda: self.in_flight,
            served_version=lambda: self._client.version if self._client is not None else None,
            servers=lambda: self._client.servers if self._client is not None else (),
            policy_lag=self._policy_lag,
        )

    @property
    def in_flight(self) -> int:
        """Episodes running now."""
        return len(self._in_flight)

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested.is_set()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop taking new episodes (first call); abandon in-flight episodes at once (second call).

        Safe to call from the event loop's signal handlers; call it on the loop's thread.
        """
        if not self._stop_requested.is_set():
            self._stop_reason = reason
            log.info("%s: no new episodes; %d in flight", reason, self.in_flight)
            self._stop_requested.set()
        elif not self._abandon_now.is_set():
            log.warning("%s again: abandoning %d in-flight episodes now", reason, self.in_flight)
            self._abandon_now.set()

    async def run(self) -> CollectorReport:
        """Collect until stopped (or ``max_episodes`` / ``duration_s``), then flush and report.

        Start-up waits (retrying) until the run's topics exist on a reachable cluster, so collectors may start before
        the broker; a stop request during that wait ends the run with nothing collected.
        """
        started = time.monotonic()
        settings = self.settings
        self.prometheus.serve(settings.metrics_port, "collector.metrics_port")
        self._wandb = await asyncio.to_thread(tracker, self.cfg, "collector", self.collector_id)
        background: list[asyncio.Task[None]] = []
        if settings.duration_s is not None:
            background.append(asyncio.create_task(self._stop_after(settings.duration_s), name="duration"))
        ready = await self._until_ready("creating the run's topics", lambda: ensure_run_topics(self.cfg))
        self._producer = Producer(self.cfg.kafka, client_id=f"collector-{self.collector_id}")
        inference = self.cfg.inference
        if settings.mode == "sync":
            # Pinned: the version changes only between rounds, when the collector refreshes it itself.
            inference = inference.model_copy(update={"version_poll_s": math.inf})
        self._client = InferenceClient(inference, self.cfg.model.policy_id)
        limited = pacing.rate_limited(settings, self.cfg.learner)
        if settings.pause_above_policy_lag is not None or limited:
            self._published = PublishedVersions(self.cfg, f"collector-{self.collector_id}-weights")
            ready = ready and await self._until_ready(f"reading {self.topics.weights}", self._published.start)
        if limited:
            self._limiter = InsertLimiter(self.cfg, f"collector-{self.collector_id}-inserts")
        if self.cfg.model.base is not None:
            # Recorded on every trajectory: the learner tells another model in a folder of the same name apart.
            model_dir = resolve_model_dir(self.cfg)
            self._base_fingerprint = await asyncio.to_thread(base_fingerprint, self.cfg, model_dir)
        if self._sampler is None:
            seed = stable_int(f"{self.cfg.env.seed}:{self.collector_id}")
            self._sampler = await asyncio.to_thread(make_sampler, self.cfg.env, settings.split, seed=seed)
        log.info(
            "collector %s: %d %s envs, %s mode, %s actions from %s, run %s",
            self.collector_id,
            settings.envs,
            self.cfg.env.kind,
            settings.mode,
            self.mode,
            ", ".join(self._client.urls),
            self.cfg.run,
        )
        background += [
            asyncio.create_task(self._pump_producer(), name="producer-poll"),
            asyncio.create_task(self._report_metrics(), name="metrics"),
        ]
        if not ready:
            workers = []
        elif settings.mode == "sync":
            workers = [asyncio.create_task(self._keep_alive("rounds", self._sync_rounds), name="rounds")]
        else:
            workers = [
                asyncio.create_task(self._keep_alive(f"slot {i}", lambda i=i: self._slot(i)), name=f"slot-{i}")
                for i in range(settings.envs)
            ]
        try:
            await self._supervise(workers)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._client.aclose()
            if self._published is not None:
                self._published.close()
            if self._limiter is not None:
                self._limiter.close()
            self.prometheus.close()
        undelivered = await self._flush()
        # After the flush, so the final report counts every delivery; closing sends it (or logs that it could not).
        self._publish_metrics(final=True)
        await asyncio.to_thread(self._producer.close, min(self.settings.flush_timeout_s, 5.0))
        if self._wandb is not None:
            await asyncio.to_thread(self._wandb.close)
        stats = self.stats
        report = CollectorReport(
            collector_id=self.collector_id,
            mode=settings.mode,
            episodes=stats.episodes,
            by_termination=dict(stats.by_termination),
            published=stats.published,
            delivered=stats.delivered,
            dropped=stats.dropped,
            publish_failures=stats.publish_failures,
            undelivered=undelivered,
            abandoned_ids=tuple(stats.abandoned_ids),
            rounds=stats.rounds,
            duration_s=time.monotonic() - started,
            stop_reason=self._stop_reason or "done",
            failure=self._failure,
        )
        log.info("%s", report.summary())
        return report

    # --- lifecycle -------------------------------------------------------------------------------------------

    async def _supervise(self, workers: list[asyncio.Task[None]]) -> None:
        """Wait for the workers; once a stop is requested give them the grace period, then cancel them."""
        all_done = asyncio.gather(*workers, return_exceptions=True)
        stop = asyncio.create_task(self._stop_requested.wait())
        abandon = asyncio.create_task(self._abandon_now.wait())
        try:
            await asyncio.wait({all_done, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not all_done.done():
                grace = self.settings.shutdown_grace_s
                log.info("waiting up to %.0fs for %d in-flight episodes", grace, self.in_flight)
                await asyncio.wait({all_done, abandon}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
                if not all_done.done():
                    log.warning("abandoning %d in-flight episodes", self.in_flight)
                    for worker in workers:
                        worker.cancel()
            for result in await all_done:
                if isinstance(result, Exception):
                    log.error("worker failed: %s: %s", type(result).__name__, result)
        finally:
            stop.cancel()
            abandon.cancel()

    async def _keep_alive(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run a worker (an env slot, the sync rounds) until it returns. An error it lets escape restarts it after a
        back-off, as an errored episode backs its slot off; one retrying cannot cure stops the collector."""
        backoff = 0.0
        while True:
            try:
                await work()
                return
            except _FATAL as exc:
                self._fail(name, exc)
                return
            except Exception as exc:
                backoff = min(max(2 * backoff, self.settings.error_backoff_s), self.settings.error_backoff_max_s)
                log.warning("%s failed (%s: %s); restarting it in %.1fs", name, type(exc).__name__, exc, backoff)
                await self._sleep(backoff)
            if self.stopping:
                return

    def _fail(self, where: str, exc: Exception) -> None:
        """Stop collecting for an error retrying cannot cure; the report and the exit status name the first one."""
        if self._failure is None:
            self._failure = f"{where}: {type(exc).__name__}: {exc}"
            log.error("cannot collect: %s", self._failure)
        if not self.stopping:
            self.request_stop(f"failed: {self._failure}")

    async def _until_ready(self, what: str, step: Callable[[], object]) -> bool:
        """Run a blocking start-up step off the loop, retrying while Kafka fails it; False when stopped first (or
        when the cluster refuses the credentials: retrying cannot cure that)."""
        backoff = max(self.settings.error_backoff_s, 0.5)
        while not self.stopping:
            try:
                await asyncio.to_thread(step)
                return True
            except KafkaAuthenticationError as exc:
                self._fail(what, exc)
            except KafkaClientError as exc:
                log.warning("%s failed (%s); retrying in %.0fs", what, exc, backoff)
                await self._sleep(backoff)
                backoff = min(2 * backoff, max(self.settings.error_backoff_max_s, backoff))
        return False

    async def _stop_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.request_stop("duration reached")

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking early when a stop is requested."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

    def _more_to_claim(self) -> bool:
        """Whether another episode may start: not stopping, and ``max_episodes`` (if set) not all started."""
        limit = self.settings.max_episodes
        return not self.stopping and (limit is None or self._claimed < limit)

    def _claim(self) -> bool:
        """Reserve the right to start one episode (False when stopping or ``max_episodes`` are all started)."""
        if not self._more_to_claim():
            if not self.stopping:
                self._stop_reason = self._stop_reason or f"max_episodes={self.settings.max_episodes} reached"
            return False
        self._claimed += 1
        return True

    # --- the two modes ---------------------------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        """Async mode: one env slot runs episodes back to back."""
        env = self._env_factory()
        backoff = 0.0
        try:
            while await self._fresh_enough() and self._claim():
                outcome = await self._guarded_episode(env)
                if outcome is None or outcome.termination in _ERRORS:
                    if outcome is None or outcome.termination is Termination.ENV_ERROR:
                        env = await self._replace_env(env)
                    backoff = min(max(2 * backoff, self.settings.error_backoff_s), self.settings.error_backoff_max_s)
                    await self._sleep(backoff)
                else:
                    backoff = 0.0
        finally:
            await _close_quietly(env)
            log.debug("slot %d finished", index)

    async def _sync_rounds(self) -> None:
        """Sync mode: rounds of one episode per env on one version, a barrier, then a wait for the next version."""
        envs = [self._env_factory() for _ in range(self.settings.envs)]
        try:
            while await self._fresh_enough():
                version = await self._round_version()
                if version is None:
                    break
                slots = [i for i in range(len(envs)) if self._claim()]
                if not slots:
                    break
                self.stats.rounds += 1
                number, began = self.stats.rounds, time.monotonic()
                outcomes = await asyncio.gather(*(self._guarded_episode(envs[i]) for i in slots))
                versions = sorted({s.policy_version for o in outcomes if o is not None for s in o.steps})
                log.info(
                    "round %d: %d episodes in %.1fs on version %s",
                    number,
                    len(slots),
                    time.monotonic() - began,
                    ",".join(map(str, versions)) or str(version),
                )
                for i, outcome in zip(slots, outcomes, strict=True):
                    if outcome is None or outcome.termination is Termination.ENV_ERROR:
                        envs[i] = await self._replace_env(envs[i])
                if not self._more_to_claim():
                    break
                await self._wait_for_version(version + 1, number)
        finally:
            await asyncio.gather(*(_close_quietly(env) for env in envs))

    async def _round_version(self) -> int | None:
        """The version the next round acts with (read from the server now); None when stopping."""
        assert self._client is not None
        backoff = self.settings.error_backoff_s
        while not self.stopping:
            try:
                return await self._client.refresh_versions()
            except InferenceError as exc:
                log.warning("cannot read the served version (%s); retrying in %.0fs", exc, backoff)
                await self._sleep(backoff)
                backoff = min(2 * backoff, self.settings.error_backoff_max_s)
        return None

    async def _wait_for_version(self, target: int, round_number: int) -> None:
        """Sync mode: wait until the server serves ``target`` or newer, up to ``sync_version_timeout_s``."""
        assert self._client is not None
        began = time.monotonic()
        timeout = self.settings.sync_version_timeout_s
        next_log = began
        while not self.stopping:
            served = await self._served_version(force=True)
            if served >= target:
                log.info(
                    "version %d served after %.1fs: starting round %d",
                    served,
                    time.monotonic() - began,
                    round_number + 1,
                )
                return
            waited = time.monotonic() - began
            if waited >= timeout:
                log.warning(
                    "no version %d after %.0fs (sync_version_timeout_s): round %d runs on version %d",
                    target,
                    waited,
                    round_number + 1,
                    served,
                )
                return
            if time.monotonic() >= next_log:
                log.info(
                    "round %d done: waiting for the learner's version %d (serving %d, waited %.0fs of %.0fs)",
                    round_number,
                    target,
                    served,
                    waited,
                    timeout,
                )
                next_log += _WAIT_LOG_EVERY_S
            await self._sleep(self.settings.version_refresh_s)

    # --- versions and pause_above_policy_lag -----------------------------------------------------------------

    async def _served_version(self, *, force: bool = False) -> int:
        """The newest version the server serves, re-read at most every ``version_refresh_s`` (unless ``force``)."""
        assert self._client is not None
        now = time.monotonic()
        if force or now - self._served_checked_at >= self.settings.version_refresh_s:
            self._served_checked_at = now
            try:
                await self._client.refresh_versions()
            except InferenceError as exc:
                log.debug("cannot read the served version: %s", exc)
        return self._client.version

    async def _fresh_enough(self) -> bool:
        """Wait while the served version is more than ``pause_above_policy_lag`` behind the learner's, or the
        learner is behind the samples-per-insert budget; False when stopping."""
        while not self.stopping:
            reason = await self._pause_reason()
            if reason is None:
                if self._paused:
                    log.info("resuming new episodes")
                    self._paused = False
                    self._paused_s += time.monotonic() - self._paused_at
                return True
            if not self._paused:
                log.warning("pausing new episodes: %s", reason)
                self._paused = True
                self._paused_at = time.monotonic()
            await self._sleep(self.settings.version_refresh_s)
        return False

    async def _pause_reason(self) -> str | None:
        """Why no new episode may start now (None: it may)."""
        if self._published is None:
            return None
        latest = self._published.poll()
        lag = self.settings.pause_above_policy_lag
        if lag is not None:
            served = await self._served_version()
            if latest - served > lag:
                behind = latest - served
                return (
                    f"serving version {served}, {behind} behind the learner's {latest} (pause_above_policy_lag {lag})"
                )
        limiter = self._limiter
        if limiter is None:
            return None
        now = time.monotonic()
        if now - self._limit_checked_at >= self.settings.version_refresh_s:
            self._limit_checked_at = now
            try:
                await asyncio.to_thread(limiter.refresh)
            except KafkaAuthenticationError:
                raise  # not a lost cluster: the slot's keeper stops the collector
            except KafkaClientError as exc:  # the last count stands; the producer reports a lost cluster itself
                log.debug("cannot count the episodes on %s: %s", limiter.topic, exc)
        step = self._published.learner_step
        if limiter.allows(step, self.in_flight):
            return None
        return (
            f"{limiter.on_topic} episodes on {limiter.topic}, the learner sampled {step * limiter.batch_episodes} "
            f"(samples_per_insert {limiter.samples_per_insert}: budget {limiter.budget(step):.0f})"
        )

    # --- one episode -----------------------------------------------------------------------------------------

    async def _guarded_episode(self, env: DeviceEnv) -> EpisodeOutcome | None:
        """Run and publish one episode; a bug in this code is logged (None) instead of ending the slot."""
        try:
            return await self._episode(env)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("episode failed unexpectedly; the slot goes on with a fresh environment")
            return None

    async def _episode(self, env: DeviceEnv) -> EpisodeOutcome:
        """The one code path of both modes: run an episode, count it, publish it (or abandon it on cancellation)."""
        assert self._sampler is not None and self._client is not None
        task = self._sampler.sample()
        episode_id = uuid.uuid4().hex
        self._in_flight.add(episode_id)
        try:
            outcome = await run_episode(
                env,
                task,
                self._client,
                self.mode,
                episode_id=episode_id,
                on_step=self._count_step,
                screenshots=self._screenshots,
                prompter=self._prompter,
            )
        except asyncio.CancelledError:
            self.stats.abandon(episode_id)
            log.warning("abandoned episode %s (task %s) at shutdown", episode_id, task.id)
            raise
        finally:
            self._in_flight.discard(episode_id)
        self.stats.episode(outcome.termination, len(outcome.steps))
        self.prometheus.episode((outcome.ended_at - outcome.started_at).total_seconds(), outcome.success)
        self._sampler.update(task, outcome.success)
        if outcome.termination not in _ERRORS:
            self._publish(outcome)
        else:
            # A sync round ends when the learner has read every attempt of it (distrl_stream.pacing): even one that
            # failed before its first step is published, as a record the learner counts and does not train on.
            keep = self.settings.on_error == "publish" and (bool(outcome.steps) or self.settings.mode == "sync")
            log.warning(
                "episode %s (task %s) ended by %s after %d steps (%s): %s",
                episode_id,
                task.id,
                outcome.termination.value,
                len(outcome.steps),
                "published" if keep else "not published",
                outcome.error,
            )
            if keep:
                self._publish(outcome)
            else:
                self.stats.dropped += 1
        return outcome

    def _count_step(self, step: Step) -> None:
        self.stats.step(step.inference_latency_s, step.env_latency_s)
        self.prometheus.step(step.inference_latency_s, step.env_latency_s)

    def _trajectory(self, outcome: EpisodeOutcome) -> TrajectoryEvent:
        return outcome.to_event(
            run=self.cfg.run,
            collector_id=self.collector_id,
            mode=self.mode,
            base_model=self.cfg.model.base_model_id,
            base_fingerprint=self._base_fingerprint,
        )

    # --- Kafka -----------------------------------------------------------------------------------------------

    def _publish(self, outcome: EpisodeOutcome) -> None:
        """Queue the trajectory (librdkafka sends it in the background); failures are counted, never raised."""
        assert self._producer is not None
        try:
            self._producer.produce_event(
                self.topics.trajectories, self._trajectory(outcome), on_delivery=self._delivered
            )
        except (DistrlError, BufferError) as exc:
            self.stats.produce_failures += 1
            log.error("could not publish episode %s: %s: %s", outcome.episode_id, type(exc).__name__, exc)
            # A rejected record leaves the producer usable; any other client error means a broken producer.
            if isinstance(exc, KafkaClientError) and not isinstance(exc, RecordRejectedError):
                self._renew_producer()
            return
        self.stats.published += 1
        if self._limiter is not None:
            self._limiter.published()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.stats.delivered += 1
        else:
            self.stats.delivery_failures += 1
            log.error("trajectory %s was not delivered: %s", (msg.key() or b"").decode(errors="replace"), err.str())

    def _renew_producer(self) -> None:
        """A producer in a fatal state (or stuck with a full queue) is replaced; the old one flushes what it can."""
        old = self._producer
        assert old is not None
        self._producer = Producer(self.cfg.kafka, client_id=f"collector-{self.collector_id}")
        asyncio.get_running_loop().run_in_executor(None, old.close, 5.0)
        log.warning("replaced the Kafka producer")

    async def _pump_producer(self) -> None:
        """Serve delivery reports regularly: produce() alone only serves them when an episode ends."""
        while True:
            assert self._producer is not None
            self._producer.poll(0)
            await asyncio.sleep(_PRODUCER_POLL_S)

    def _policy_lag(self) -> int | None:
        """Served version behind the learner's newest (known only with ``pause_above_policy_lag``)."""
        if self._published is None or self._client is None:
            return None
        return self._published.latest - self._client.version

    async def _report_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.settings.metrics_interval_s)
            self._publish_metrics()

    def _publish_metrics(self, *, final: bool = False) -> None:
        assert self._producer is not None and self._client is not None
        extra: dict[str, float] = {}
        if self._published is not None:
            extra["learner_version"] = float(self._published.latest)
            extra["policy_lag"] = float(self._published.latest - self._client.version)
        # Cumulative seconds new episodes waited for the learner (pause_above_policy_lag, samples_per_insert).
        extra["paused_s"] = self._paused_s + (time.monotonic() - self._paused_at if self._paused else 0.0)
        values = self.stats.snapshot(
            policy_version=self._client.version, in_flight=self.in_flight, paused=self._paused, extra=extra
        )
        labels = {"mode": self.settings.mode, "env_kind": self.cfg.env.kind, "policy_id": self.cfg.model.policy_id}
        if final:
            labels["event"] = "final"
        event = MetricEvent(
            run=self.cfg.run,
            role="collector",
            source_id=self.collector_id,
            timestamp=utc_now(),
            values=values,
            labels=labels,
        )
        if self._wandb is not None:
            self._wandb.log("collector", values)
        try:
            self._producer.produce_event(self.topics.metrics, event)
        except (DistrlError, BufferError) as exc:
            log.warning("could not publish metrics: %s", exc)

    async def _flush(self) -> int:
        """Wait for the broker to acknowledge what was queued; returns how many trajectories stayed unacknowledged."""
        assert self._producer is not None
        producer = self._producer
        left = await asyncio.to_thread(producer.client.flush, self.settings.flush_timeout_s)
        undelivered = self.stats.published - self.stats.delivered - self.stats.delivery_failures
        if left:
            log.error(
                "%d messages (%d trajectories) still unacknowledged after %.0fs: they are lost",
                left,
                undelivered,
                self.settings.flush_timeout_s,
            )
        return max(undelivered, 0) if left else 0

    async def _replace_env(self, env: DeviceEnv) -> DeviceEnv:
        """After an environment error the device may be broken: close it and start from a fresh one."""
        await _close_quietly(env)
        return self._env_factory()


async def _close_quietly(env: DeviceEnv) -> None:
    try:
        await asyncio.wait_for(env.close(), 30.0)
    except Exception as exc:
        log.warning("closing %s env failed: %s: %s", env.kind, type(exc).__name__, exc)


def run_collector(cfg: Config) -> CollectorReport:
    """Run a collector in a new event loop until SIGTERM/SIGINT (or its limits); the ``collect`` command's body.

    The first signal stops new episodes and lets in-flight ones finish within ``shutdown_grace_s``; a second one
    abandons them at once.

    Raises:
        KafkaClientError: start-up could not create or read the run's topics.
    """

    async def main() -> CollectorReport:
        collector = Collector(cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, collector.request_stop, signal.Signals(sig).name)
        try:
            return await collector.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
