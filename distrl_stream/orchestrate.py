"""`distrl-stream up`: a whole run on one machine, as child processes of the real CLI commands.

Start order: the embedded Kafka broker (unless a cluster is given), the run's topics, the base model (the tiny local
model is built if none is configured), the vLLM server (``serve``, with its weight-version watcher), the learner
(``learn``) and N collectors (``collect``). Stop order is the reverse of what depends on what: collectors first (they
finish or abandon their episodes and flush), then the learner (it writes a final checkpoint), then the server, then
the broker, so nothing is lost and every role sees its peers go in order.

Children never outlive ``up``:

- each child runs in its own process group (``start_new_session``), and stopping it signals the whole group, then
  kills any descendant that left the group (vLLM's engine runs in a session of its own under ``serve``);
- each child is started with Linux's parent-death signal, so even a SIGKILL of ``up`` sends them SIGTERM;
- :meth:`LocalStack.stop` runs on every exit path (end of ``--duration``, Ctrl-C, SIGTERM, a child that died).

Every child gets its configuration the way any deployment would: the user's ``--config`` file (if any) plus
``DISTRL_*`` environment variables for what ``up`` decided (broker address, model folder, server URL, env kind...).
Environment beats the file, so ``up``'s flags win over the file, as flags do everywhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distrl_stream import pacing
from distrl_stream.config import Config, sync_round_episodes
from distrl_stream.errors import DistrlError, UpError
from distrl_stream.events import MetricEvent, decode
from distrl_stream.inference.client import served_name
from distrl_stream.inference.server import wait_ready
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.monitor.prometheus import RoleMetrics
from distrl_stream.monitor.wandb import Tracker, tracker
from distrl_stream.policy.model_dir import resolve_model_dir
from distrl_stream.processes import ChildProcess, free_port, log_report, port_free

log = logging.getLogger(__name__)

# The port clients assume by default (kafka.bootstrap_servers = 127.0.0.1:9092): `up` takes it when it is free, so
# `monitor`, `replay` and `topics` find the broker afterwards without any flag.
DEFAULT_BROKER_PORT = 9092


# What `up` changes from the library defaults when the user left a field at its default (file, environment and flags
# all win): a tiny model learning on a 2-core machine within minutes. The library defaults are the paper's and the
# authors' (docs/learner.md); these are ours, measured with `make demo` (docs/cli.md).
UP_PROFILE: dict[str, dict[str, Any]] = {
    # Three 2-step templates the tiny model tells apart (the learning benchmark's), instead of all sixteen.
    "env": {"templates": ["take_photo", "turn_on_setting", "alarm_on"]},
    # 2 collectors × 4 envs, never more than two samples' worth of episodes ahead of the learner (collector.ratelimit):
    # collection otherwise takes the CPU the learner needs.
    "collector": {"envs": 4, "samples_per_insert": 2.0},
    # The CPU/tiny-model profile of docs/learner.md: larger steps, a critic warm-up and batch-centred advantages;
    # a version every 5 updates so the served policy visibly moves; one torch thread, the other core for vLLM.
    # policy_lr 1e-3, not the benchmark's 3e-4: a short run from scratch gains most from it (docs/cli.md).
    "learner": {
        "policy_lr": 1e-3,
        # Over three seeds A-RIDE learns a two-step task sooner at 0.9 than at the authors' 0.5 (docs/learner.md).
        "gamma": 0.9,
        "critic_lr": 1e-3,
        "critic_warmup_updates": 10,
        "advantage_centering": True,
        "updates_per_version": 5,
        "threads": 1,
    },
}
# `up`'s profile when the base is a pretrained model (its tokenizer has a chat template; docs/cli.md). SmolLM2-135M is
# 400 times the tiny model and a step's chat prompt ~290 tokens: one torch thread does a forward + backward at about
# 200 tokens/s, so an update of a few episodes takes tens of seconds and the learner, not collection, sets the pace
# (bench/results/pretrained.json).
PRETRAINED_UP_PROFILE: dict[str, dict[str, Any]] = {
    # The tiny model's three 2-step templates: SmolLM2 solves 9-14% of them zero-shot and none of 50 tasks of five
    # longer ones (docs/learner.md, "RL fine-tuning of a pretrained model"), where RL has nothing to reinforce.
    "env": UP_PROFILE["env"],
    # The chat prompt lists the candidates: the longest sim prompt plus its longest action is 385 SmolLM2 tokens.
    # Server and learner in the precision `auto` picks (bf16 on these CPUs' AVX-512 BF16 units): ρ clipping and
    # Retrace absorb the bf16 log-prob gap (docs/learner.md, "Precision").
    "inference": {"max_model_len": 2048},
    # Fewer envs leave CPU to the learner. Unpaused, two envs finish ~2.5 times the episodes one learner core trains
    # on: at one sample per episode the collectors sat paused 57% of a run (docs/cli.md), at two episodes per sample
    # DPER chooses which half to learn from, as the paper's never-waiting collectors leave it to.
    "collector": {"envs": 2, "samples_per_insert": 0.5},
    "learner": {
        # Four episodes a batch: batches of two held no success in 19 of 20 updates of the earlier float32 runs, batches
        # of four one in two in the bf16 runs, whose collectors succeeded in 8-18% of their episodes, and in bf16 at
        # the same step batches of two ended below zero-shot (docs/learner.md, "In bf16 at `policy_lr` 1e-4 with
        # 4-episode batches: the four methods"); affordable since bf16 and the shared prefix.
        "batch_episodes": 4,
        "min_buffer_episodes": 4,
        # The batch in one forward pass (no second one), layers checkpointed: in bf16 with the shared prefix 19.9 s
        # a 2-episode update at a peak RSS of 2.6 GB, where 2-step micro-batches redo each forward and no
        # checkpointing needs ~8.6 GB (docs/learner.md, "Precision").
        "gradient_checkpointing": True,
        # Re-scoring priorities is a forward pass per episode (a buffer of ~100k tokens after a few minutes is
        # minutes of one core): 1/200 of the buffer per update, about one episode, instead of the authors' 1/20;
        # sampled episodes are re-scored after every update anyway.
        "priority_refresh_interval": 200,
        # A third of the tiny model's benchmark step: with 4-episode batches the setting under which A-RIDE lifted
        # SmolLM2 on MiniWoB++ (0.47 → 0.52) and the sim templates (0.115 → 0.170) over three seeds each, where 3e-4
        # with 2-episode batches traded one task's successes for another's (docs/learner.md, "RL fine-tuning of a
        # pretrained model").
        "policy_lr": 1e-4,
        "gamma": 0.9,
        "critic_lr": 1e-3,
        # Two, not the tiny model's 10: at ~28 s an update, 10 would be half of a ten-minute run's policy steps; the
        # runs above warmed up for 2.
        "critic_warmup_updates": 2,
        "advantage_centering": True,
        "updates_per_version": 2,
        "threads": 1,
    },
}
# Held-out test-split tasks `up` evaluates at the start (the untrained policy) and at the end (the last version).
UP_EVAL_TASKS = 40


# The local vision model's chat prompt with its screenshot is ~420 tokens on the sim (under 500 in every step
# measured), ~820 with every field at its cap: its own limit (docs/policy.md). The pretrained profile has 2048.
VISION_MAX_MODEL_LEN = 1024


def up_profile(cfg: Config, *, pretrained: bool = False, vision: bool = False) -> dict[str, dict[str, Any]]:
    """The entries of :data:`UP_PROFILE` (:data:`PRETRAINED_UP_PROFILE` for a ``pretrained`` base; for the local
    ``vision`` model with :data:`VISION_MAX_MODEL_LEN`) for the fields ``cfg`` leaves unset (no file, variable or
    flag gave them, whatever the value), less a rate limit the run's pacing cannot take (distrl_stream.pacing)."""
    out: dict[str, dict[str, Any]] = {}
    profile = PRETRAINED_UP_PROFILE if pretrained else UP_PROFILE
    if vision and not pretrained:
        profile = {**profile, "inference": {**profile.get("inference", {}), "max_model_len": VISION_MAX_MODEL_LEN}}
    for section, values in profile.items():
        given = getattr(cfg, section).model_fields_set
        kept = {k: v for k, v in values.items() if k not in given}
        if kept:
            out[section] = kept
    if "samples_per_insert" in out.get("collector", {}):
        collector = cfg.collector.model_copy(update=out["collector"])
        try:
            pacing.check(collector, cfg.learner.model_copy(update=out.get("learner", {})))
        except ValueError:  # e.g. filtered BC: no update without a success, so nothing would lift a pause
            del out["collector"]["samples_per_insert"]
    return out


def uses_external_kafka(cfg: Config) -> bool:
    """Whether the user named a cluster (a flag, the file or a variable; any address, the default one too): ``up``
    then uses it instead of starting the embedded broker."""
    return "bootstrap_servers" in cfg.kafka.model_fields_set


# Reports progress of a slow start: (stage, state) with state "start" | "done".
StageCallback = Callable[[str, str], None]


class UpMetrics(RoleMetrics):
    """``up``'s own metrics: its child processes.

    Args:
        run: the run.
        processes: child name -> whether it is running.
        uptime_s: seconds since everything was up (None while starting).
    """

    def __init__(
        self, run: str, *, processes: Callable[[], Mapping[str, bool]], uptime_s: Callable[[], float | None]
    ) -> None:
        super().__init__(run, "up", "up")
        self.gauge(
            "distrl_up_process_running",
            "1 while the child process runs, 0 once it exited.",
            lambda: {name: float(running) for name, running in processes().items()},
            "process",
        )
        self.gauge("distrl_up_uptime_seconds", "Seconds since every role was started.", uptime_s)


@dataclass(frozen=True)
class UpOptions:
    """How ``up`` runs the roles.

    Attributes:
        collectors: collector processes.
        config_path: the user's TOML file, passed on to every child.
        external_kafka: use ``cfg.kafka.bootstrap_servers`` as given instead of starting the embedded broker.
        keep_broker: leave the embedded broker running after ``up`` ends (for replays right after).
        startup_timeout_s: bound on the vLLM server's start.
        collector_stop_s: how long collectors get after SIGTERM (their shutdown grace plus the flush).
        learner_stop_s: how long the learner gets after SIGTERM to write its final checkpoint.
        metrics_port: ``up``'s own Prometheus port (0: a free one). When set, every child also serves its metrics,
            each on a free port of its own (a fixed port could not be shared by N collectors); None: no metrics
            from ``up`` (the children then follow their own ``metrics_port`` fields).
        eval_tasks: held-out test-split tasks to evaluate the served policy on, once the server is up (before the
            learner starts) and once the learner has stopped (before the server does); 0: no evaluation.
    """

    collectors: int = 2
    config_path: Path | None = None
    external_kafka: bool = False
    keep_broker: bool = False
    startup_timeout_s: float = 600.0
    collector_stop_s: float = 60.0
    learner_stop_s: float = 180.0
    metrics_port: int | None = None
    eval_tasks: int = 0


@dataclass
class UpSummary:
    """What a run under ``up`` did and where its data is (also written to ``<run_dir>/up-summary.json``)."""

    run: str
    bootstrap_servers: str
    ran_s: float = 0.0
    episodes: int = 0
    successes: int = 0
    trajectories_per_min: float = 0.0
    versions_published: int = 0
    versions_served: list[int] = field(default_factory=list)
    learner_updates: int | None = None
    # Shares of their running time the collectors held new episodes back for the learner (their mean) and the
    # learner waited for data with nothing to update on: the pacing of the run (None: not reported).
    collectors_paused_share: float | None = None
    learner_idle_share: float | None = None
    # Ingested steps with the server's prompt ids, and those the learner's own rendering would not reproduce.
    prompt_ids_checked: int | None = None
    prompt_ids_mismatched: int | None = None
    dead_letters: int = 0
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    failure: str | None = None
    data_dir: str = ""
    run_dir: str = ""
    broker_dir: str | None = None
    logs_dir: str = ""
    report_dir: str | None = None
    # {"version", "success", "ci_low", "ci_high" (95% Wilson), "tasks"} before the learner started
    held_out_start: dict[str, float] | None = None
    held_out_end: dict[str, float] | None = None  # the same for the last version served, after the learner stopped

    @property
    def success_rate(self) -> float:
        """Fraction of episodes that succeeded."""
        return self.successes / self.episodes if self.episodes else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {**asdict(self), "success_rate": self.success_rate}


@dataclass(frozen=True)
class _MetricsReadBack:
    served: list[int]
    updates: int | None
    paused_share: float | None
    idle_share: float | None
    prompt_ids: tuple[int | None, int | None]


class LocalStack:
    """The roles of one run on this machine (see the module docstring).

    Args:
        cfg: the effective configuration of ``up`` (its flags already applied).
        options: process layout and timeouts.
        child_env: ``DISTRL_*`` variables ``up``'s flags set, passed to every child on top of this environment.
    """

    def __init__(self, cfg: Config, options: UpOptions, child_env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.options = options
        self.child_env = dict(child_env or {})
        self.topics = TopicNames(cfg.run)
        self.logs_dir = cfg.run_dir / "logs"
        self.broker: EmbeddedBroker | None = None
        self.server: ChildProcess | None = None
        self.learner: ChildProcess | None = None
        self.collectors: list[ChildProcess] = []
        # Every child, recorded before it starts: a SIGTERM to `up` between a child's start and its assignment above
        # must not leave that child running.
        self._spawned: list[ChildProcess] = []
        # An abort that arrives while a child is being spawned waits for the spawn to end (abort_start).
        self._spawning = False
        self._abort_pending = False
        self.server_url = ""
        self.started_at: float | None = None
        self.held_out: dict[str, dict[str, float]] = {}  # "start" / "end" -> UpSummary.held_out_start's form
        self._wandb: Tracker | None = None  # the held-out evaluations' W&B run (monitor.wandb_project), once one ran
        self._broker_was_running = False
        self._kafka_ready = False
        # Process name -> host:port of its Prometheus endpoint (empty unless options.metrics_port is set).
        self.metrics_targets: dict[str, str] = {}
        self.prometheus = UpMetrics(
            cfg.run,
            processes=lambda: {c.name: c.running() for c in self.children()},
            uptime_s=lambda: time.monotonic() - self.started_at if self.started_at is not None else None,
        )

    # -- start -------------------------------------------------------------------------------------------------

    def start(self, stage: StageCallback | None = None) -> None:
        """Bring everything up, in order; on failure everything started so far is stopped and the error raised.

        Raises:
            ServerStartError: the policy server did not start (the message ends with its log tail).
            DistrlError: the broker or the model could not be started or built.
        """
        stage = stage or (lambda _name, _state: None)
        try:
            self._start(stage)
        except BaseException:
            self.stop()
            raise
        self.started_at = time.monotonic()

    def _start(self, stage: StageCallback) -> None:
        port = self.prometheus.serve(self.options.metrics_port, "up --metrics-port")
        if port is not None:
            self.metrics_targets["up"] = f"127.0.0.1:{port}"
        if not self.options.external_kafka:
            stage("Kafka broker", "start")
            self._start_broker()
            stage("Kafka broker", "done")
        ensure_run_topics(self.cfg)
        self._kafka_ready = True
        stage("policy model", "start")
        model_dir = self._model_dir()
        stage("policy model", "done")
        # The configured port when it is free (default 8000), else any: a busy port must not stop a local run.
        port = self.cfg.inference.port
        if not port or not port_free(port):
            port = free_port(self.cfg.inference.host)
        self.server_url = f"http://{self.cfg.inference.host}:{port}"
        self.child_env.update(
            {
                "DISTRL_RUN": self.cfg.run,
                "DISTRL_DATA_DIR": str(self.cfg.data_dir.resolve()),
                "DISTRL_KAFKA__BOOTSTRAP_SERVERS": self.cfg.kafka.bootstrap_servers,
                "DISTRL_MODEL__BASE": str(model_dir.resolve()),
                "DISTRL_INFERENCE__HOST": self.cfg.inference.host,
                "DISTRL_INFERENCE__PORT": str(port),
                "DISTRL_INFERENCE__URL": self.server_url,
                # The collectors act with up's own server, whatever servers the config file lists.
                "DISTRL_INFERENCE__URLS": "[]",
            }
        )
        stage("vLLM server", "start")
        self.server = self._spawn("serve", ["serve", "--watch"], self._metrics_env("serve", "INFERENCE"))
        base_model = served_name(self.cfg.model.policy_id, 0)
        wait_ready(self.server_url, base_model, self.server, self.options.startup_timeout_s, self.cfg.inference.api_key)
        stage("vLLM server", "done")
        if self.options.eval_tasks:
            stage(f"held-out success before training ({self.options.eval_tasks} test tasks)", "start")
            self._evaluate("start")
            stage(f"held-out success before training ({self.options.eval_tasks} test tasks)", "done")
        stage("learner", "start")
        self.learner = self._spawn(
            "learner", ["learn"], {**self.learner_env(), **self._metrics_env("learner", "LEARNER")}
        )
        stage("learner", "done")
        stage(f"{self.options.collectors} collectors", "start")
        for i in range(self.options.collectors):
            name = f"collector-{i}"
            self.collectors.append(
                self._spawn(name, ["collect", "--collector-id", name], self._metrics_env(name, "COLLECTOR"))
            )
        stage(f"{self.options.collectors} collectors", "done")
        if self.metrics_targets:
            self._write_scrape_targets()

    def _evaluate(self, when: str) -> None:
        """Held-out success of the newest version the server serves now, as ``distrl-stream eval`` measures it (also
        published on ``{run}.metrics``), kept in :attr:`held_out` (a failure is logged: it must not stop the run nor
        its ordered shutdown)."""
        from distrl_stream.collector.heldout import EvalPlan, run_evaluation

        plan = EvalPlan(tasks=self.options.eval_tasks, concurrency=8)
        try:
            (result,) = run_evaluation(self.cfg, plan, [None], self.server_url)
        except DistrlError as exc:
            log.warning("held-out evaluation (%s) failed: %s", when, exc)
            return
        low, high = result.interval
        self.held_out[when] = {
            "version": result.version,
            "success": result.success_rate,
            "ci_low": low,
            "ci_high": high,
            "tasks": result.episodes,
        }
        self._wandb = self._wandb or tracker(self.cfg, "evaluation", "held-out")
        if self._wandb is not None:
            self._wandb.log("held_out", self.held_out[when], step=result.version)
        log.info("held-out success (%s): version %d, %.2f", when, result.version, result.success_rate)

    def _start_broker(self) -> None:
        b = self.cfg.broker
        port = b.port or (DEFAULT_BROKER_PORT if port_free(DEFAULT_BROKER_PORT) else 0)
        self.broker = EmbeddedBroker(
            self.cfg.data_dir / "kafka",
            kafka_home=b.kafka_home,
            port=port,
            heap_mb=b.heap_mb,
            startup_timeout_s=b.startup_timeout_s,
            properties=b.properties,
        )
        self._broker_was_running = self.broker.status().running
        bootstrap = self.broker.start(detach=self.options.keep_broker)
        self.cfg = self.cfg.model_copy(
            update={"kafka": self.cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap})}
        )

    def _model_dir(self) -> Path:
        return resolve_model_dir(self.cfg)

    def learner_env(self) -> dict[str, str]:
        """The learner's own ``DISTRL_*`` variables: round mode when the collectors are synchronous.

        A learner round given explicitly (``learner.round_episodes``) is kept; otherwise sync collectors get a learner
        that updates once per complete round of every env's episode, as the learning benchmark's sync method does.
        """
        if self.cfg.learner.round_episodes or self.cfg.collector.mode != "sync":
            return {}
        return {"DISTRL_LEARNER__ROUND_EPISODES": str(sync_round_episodes(self.cfg.collector, self.options.collectors))}

    def _metrics_env(self, name: str, section: str) -> dict[str, str]:
        """When ``up`` serves metrics: a free port for child ``name``, as its ``DISTRL_<SECTION>__METRICS_PORT``."""
        if self.options.metrics_port is None:
            return {}
        port = free_port()
        self.metrics_targets[name] = f"127.0.0.1:{port}"
        return {f"DISTRL_{section}__METRICS_PORT": str(port)}

    def _write_scrape_targets(self) -> None:
        """``<run_dir>/prometheus-targets.json``: the endpoints in Prometheus' file_sd format (docs/monitor.md)."""
        targets = [
            {"targets": [address], "labels": {"run": self.cfg.run, "process": name}}
            for name, address in self.metrics_targets.items()
        ]
        self.cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (self.cfg.run_dir / "prometheus-targets.json").write_text(json.dumps(targets, indent=2))

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> ChildProcess:
        config = ["--config", str(self.options.config_path)] if self.options.config_path else []
        argv = [sys.executable, "-m", "distrl_stream.cli", *args[:1], *config, *args[1:]]
        child_env = {**os.environ, **self.child_env, **(env or {})}
        child = ChildProcess(name, argv, child_env, self.logs_dir / f"{name}.log")
        self._spawned.append(child)
        self._spawning = True
        try:
            child.start()
        finally:
            self._spawning = False
        log.info("%s started (pid %s), log %s", name, child.pid, child.log_path)
        if self._abort_pending:
            raise KeyboardInterrupt
        return child

    def abort_start(self) -> None:
        """Abort a start in progress as Ctrl-C does (raise KeyboardInterrupt; a signal handler calls it), except
        inside a child's spawn: an interrupt within ``subprocess.Popen`` loses the pid of a child that is already
        running, which then outlives the stop. There the abort is deferred to the spawn's end."""
        if self._spawning:
            self._abort_pending = True
            return
        raise KeyboardInterrupt

    # -- run ---------------------------------------------------------------------------------------------------

    def children(self) -> list[ChildProcess]:
        """Every child started, in start order."""
        return [c for c in (self.server, self.learner, *self.collectors) if c is not None]

    def failure(self) -> str | None:
        """A description of the first child that failed on its own (None while all run or ended cleanly)."""
        for child in self.children():
            if not child.stopping and child.returncode not in (None, 0):
                return f"{child.name} exited with code {child.returncode} {log_report(child.log_path)}"
        return None

    # -- stop --------------------------------------------------------------------------------------------------

    def stop(self, stage: StageCallback | None = None) -> dict[str, int | None]:
        """Stop in order: collectors, learner (final checkpoint), server, broker. Idempotent; returns exit codes."""
        stage = stage or (lambda _name, _state: None)
        codes: dict[str, int | None] = {}
        if self.collectors:
            stage("collectors", "start")
            for c in self.collectors:  # all at once: each has its own grace period for in-flight episodes
                c.terminate()
            for c in self.collectors:
                codes[c.name] = c.stop(self.options.collector_stop_s)
            stage("collectors", "done")
        if self.learner is not None:
            stage("learner (final checkpoint)", "start")
            codes[self.learner.name] = self.learner.stop(self.options.learner_stop_s)
            stage("learner (final checkpoint)", "done")
        # Only a run that got going has a last version to measure (not a start that failed half-way).
        running = self.started_at is not None and self.server is not None and self.server.running()
        if self.options.eval_tasks and "end" not in self.held_out and running:
            stage(f"held-out success of the last version ({self.options.eval_tasks} test tasks)", "start")
            self._evaluate("end")
            stage(f"held-out success of the last version ({self.options.eval_tasks} test tasks)", "done")
        if self.server is not None:
            stage("vLLM server", "start")
            codes[self.server.name] = self.server.stop(self.cfg.inference.stop_timeout_s + 15.0)
            stage("vLLM server", "done")
        for child in self._spawned:
            if child.name not in codes:  # started, but `up` was stopped before it could keep it
                codes[child.name] = child.stop(self.cfg.inference.stop_timeout_s + 15.0)
        self.prometheus.close()
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None
        return codes

    def kill(self) -> None:
        """SIGKILL every child that is still running, with its descendants (the last resort; idempotent)."""
        for child in self._spawned:
            if child.running():
                child.terminate()
                child.stop(0.0)

    def stop_broker(self, stage: StageCallback | None = None) -> None:
        """Stop the embedded broker if ``up`` started it and was not asked to keep it."""
        if self.broker is None or self.options.keep_broker or self._broker_was_running:
            return
        stage = stage or (lambda _name, _state: None)
        stage("Kafka broker", "start")
        self.broker.stop()
        stage("Kafka broker", "done")

    # -- summary -----------------------------------------------------------------------------------------------

    def summarize(self, exit_codes: dict[str, int | None], failure: str | None, report: bool) -> UpSummary:
        """Read the run back from Kafka (trajectories, weights, metrics) and write the summary (and the report).

        Call it after :meth:`stop` and before :meth:`stop_broker`.
        """
        from distrl_stream.analysis.replay import EpisodeSummary, read_trajectories, read_weight_versions
        from distrl_stream.analysis.stats import compute_stats

        cfg = self.cfg
        summary = UpSummary(
            run=cfg.run,
            bootstrap_servers=cfg.kafka.bootstrap_servers,
            ran_s=time.monotonic() - self.started_at if self.started_at else 0.0,
            exit_codes=exit_codes,
            failure=failure,
            data_dir=str(cfg.data_dir.resolve()),
            run_dir=str(cfg.run_dir.resolve()),
            broker_dir=str(self.broker.run_dir) if self.broker is not None else None,
            logs_dir=str(self.logs_dir.resolve()),
            held_out_start=self.held_out.get("start"),
            held_out_end=self.held_out.get("end"),
        )
        try:
            if not self._kafka_ready:
                raise UpError("Kafka never came up")
            episodes = [EpisodeSummary.from_record(r) for r in read_trajectories(cfg.kafka, cfg.run, timeout_s=120)]
            weights = read_weight_versions(cfg.kafka, cfg.run)
            stats = compute_stats(episodes, weights)
            summary.episodes, summary.successes = stats.episodes, stats.successes
            # Over the run, not over the episodes' own span: a run that sat paused shows it.
            summary.trajectories_per_min = 60.0 * stats.episodes / summary.ran_s if summary.ran_s > 0 else 0.0
            summary.versions_published = max((w.version for w in weights), default=0)
            readback = self._read_metrics()
            summary.versions_served, summary.learner_updates = readback.served, readback.updates
            summary.collectors_paused_share, summary.learner_idle_share = readback.paused_share, readback.idle_share
            summary.prompt_ids_checked, summary.prompt_ids_mismatched = readback.prompt_ids
            summary.dead_letters = sum(1 for _ in read_topic(cfg.kafka, self.topics.dlq))
            if report:
                from distrl_stream.analysis.report import write_report

                summary.report_dir = str(write_report(episodes, weights, cfg.run_dir / "report", run=cfg.run).directory)
        except DistrlError as exc:
            summary.failure = (summary.failure + "\n" if summary.failure else "") + f"summary incomplete: {exc}"
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (cfg.run_dir / "up-summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
        return summary

    def _read_metrics(self) -> _MetricsReadBack:
        """What the roles' metric events say of the run: versions the server loaded, the learner's updates, and each
        side's waiting (from every source's last event)."""
        served: set[int] = set()
        updates: int | None = None
        last: dict[tuple[str, str], dict[str, float]] = {}
        for msg in read_topic(self.cfg.kafka, self.topics.metrics):
            with contextlib.suppress(DistrlError):
                event = decode(msg.value(), MetricEvent)
                if event.role == "inference" and event.labels.get("event") == "loaded":
                    served.add(int(event.values.get("policy_version", 0)))
                elif event.role == "learner" and "updates" in event.values:
                    updates = max(updates or 0, int(event.values["updates"]))
                if event.role in ("collector", "learner"):
                    last[(event.role, event.source_id)] = event.values
        paused = [
            v["paused_s"] / v["uptime_s"]
            for (role, _), v in last.items()
            if role == "collector" and v.get("uptime_s", 0) > 0 and "paused_s" in v
        ]
        idle = [
            v["idle_s"] / v["running_s"]
            for (role, _), v in last.items()
            if role == "learner" and v.get("running_s", 0) > 0 and "idle_s" in v
        ]
        learners = [v for (role, _), v in last.items() if role == "learner" and "prompt_ids_checked" in v]
        prompt_ids = (
            (
                sum(int(v["prompt_ids_checked"]) for v in learners),
                sum(int(v["prompt_ids_mismatched"]) for v in learners),
            )
            if learners
            else (None, None)
        )
        return _MetricsReadBack(
            sorted(served),
            updates,
            sum(paused) / len(paused) if paused else None,
            max(idle) if idle else None,
            prompt_ids,
        )
