"""Training efficiency and ablations: A-RIDE async vs DigiRL (async and sync rounds) vs filtered BC, and A-RIDE's parts.

The paper's claim (DistRL §5): about 3x training efficiency over synchronous multi-machine DigiRL. Measured here
side by side in one run, on the same machine, for the same wall-clock budget per method:

- **aride_async** (DistRL): the collector's K envs loop on their own with the newest served version; the learner
  trains A-RIDE (Retrace, IS-weighted advantages, DPER) continuously and publishes every ``updates_per_version``.
- **digirl_sync** (DigiRL multi-machine): rounds. Each env runs one episode on version v (barrier at the slowest),
  the learner (round mode, ``round_episodes`` = K) does ``updates_per_version`` DigiRL-style updates (trajectory-critic
  top-quantile filter, binarised doubly-robust step advantage) and publishes v+1, the collector waits for it.
- **digirl_async**: DigiRL's update rule on asynchronous collection (what changes is only the algorithm).
- **filtered_bc_async**: asynchronous collection, the learner imitates successful episodes.

Ablations of A-RIDE async (the paper's Table 3 asks the same question: which part matters), each one change:

- **aride_no_retrace**: one-step TD targets (``retrace_lambda`` = 0, so every trace c_i is 0);
- **aride_no_dper**: uniform replay (``dper_alpha`` = 0: P ∝ p⁰, and every IS weight is 1);
- **aride_no_entropy**: no entropy bonus (``entropy_coef`` = 0; A-RIDE runs the paper's β = 0.05 otherwise).

Same starting policy for all (an honest warm start, the paper's off-to-on setting): a noisy scripted policy (the
simulator's oracle, replaced by a uniformly random candidate with probability ``--noise``) plays the train tasks into
a topic of its own; a short behaviour-cloning pass on that replayed topic (``Learner.pretrain``, the ``learn
--from-replay`` path) gives the warm adapter, whose held-out success must be at most 50%. Each method's learner
starts from it (``learner.init_adapter``) and publishes it as version 1. The clone's weights differ between CPUs for the
same recipe (float rounding of another instruction set), so ``--save-warm-start DIR`` keeps the adapter with its
recipe and ``--warm-start DIR`` starts every method from it instead of cloning: seeds run on other machines then
share one warm start (the tiny model built there must equal the one it was cloned on: checked).

Same environments: the simulated phone in choice mode on 8 templates, three of them multi-step (two settings; a
setting and an alarm; a contact added and called), with heavy-tailed step latency (log-normal around a per-task scale
spanning 100x, as DistRL reports for Android), K envs in one collector, one vLLM server (tiny local model).

Same split of the machine: DistRL's learner trains on a device of its own while workers collect, so the learner
process gets one CPU core to itself and the vLLM server, the collector and the broker the other(s), for every method
(``--shared-cores``: all roles share all cores, which makes the asynchronous learner compete with collection).

Evaluation happens after the fact, so it never takes CPU from training: the base model (version 0) and every
method's published versions (evenly spaced in time, at most ``--points`` of them, always the last) are verified and
hot-loaded one by one into the same server (restarted on every core once training is over, when the bench started it
and split the cores) and run on a fixed set of held-out (test-split) tasks, one episode each
(``distrl_stream.collector.evaluation``), with the sim's step latency off: it changes how long an episode takes, never
its outcome (the sim's world depends on the task alone), and the slowest task would otherwise set the length of every
evaluation.

Headline: ``ratio`` = sync time-to-target ÷ A-RIDE async time-to-target (target ≥ 2.4), null with ``ratio_reason`` when
the sync arm did not run or either method never reached the held-out success target (``--target``, default 0.8,
``target_success``); ``metrics`` has, per method, the time to target (``time_to_target_s``: the first evaluated version
at or above it, or None), final and best held-out success, the area under the success curve (``auc``: mean held-out
success over the budget, the curve held flat before its first and after its last point), the curve itself, the learner's
own statistics over time (entropy, ρ, critic error, advantage), the untrained and warm-start success, and the run's
settings. Time of a version = when the learner published it, from the moment the method's processes were launched.

A pretrained model (``--model smollm2-135m-instruct``, the paper's setting: RL fine-tuning of a pretrained agent): the
model is pulled into the repository's data dir (``distrl-stream model pull``) and served as ``up``'s pretrained profile
serves it (in the precision ``--precision`` gives, ``max_model_len`` 2048); prompts are its chat template's; there is no
warm start: every method starts from the zero-shot policy (version 0, the base model, which each curve holds from 0 s
until the method's first version is published); the learners run the pretrained profile (``PRETRAINED_LEARNER``); K
defaults to 4 and, as on the tiny model, collection is not rate-limited. Best and final success are over a method's own
versions. The success target is one every compared method reaches (zero-shot plus half the gap to the lowest best
success among them, ``time_to_target_s``; null when one never rose above zero-shot). Beside the result file, each
method's evaluations as ``distrl-stream eval`` reports them (``<stem>_eval_<method>.json`` and ``.md``: zero-shot first,
then its versions; counts per template and per task).
With ``--env miniwob`` (``--model`` only) the same methods fine-tune it on the MiniWoB++ subset (``env.miniwob_tasks``,
real headless chromium, ``MINIWOB_BROWSERS`` per evaluation) instead of the simulator.

The sim's step latency (``metrics.latency``, with its parameters in words): log-normal around a per-task scale,
``--latency-mean`` seconds a step on average, ``--latency-sigma`` the per-step width, ``--latency-spread`` the
slowest ÷ fastest task's scale (100 by default, as DistRL reports on Android; 1 with a small sigma: near-uniform
episode times, where a synchronous round no longer waits for a much slower environment).

Usage: ``python bench/learning.py [--quick] [--budget S] [--envs K] [--eval-tasks N] [--shared-cores] [--methods M,…]
[--learner FIELD=VALUE,…] [--variant NAME:FIELD=VALUE,…] [--templates T,…] [--seed N] [--target S]
[--latency-spread X] [--latency-sigma W] [--bc-updates N] [--warm-start DIR] [--save-warm-start DIR]
[--model NAME [--env miniwob]] [--out FILE]`` writes
``bench/results/learning.json`` and ``bench/results/learning.png`` (or FILE and the plot beside it). Seeds run one per
invocation, each with its own file (a seed's methods may be split over several invocations, the same seed and
settings each); ``python bench/learning.py --combine FILE… --out FILE [--target S]`` then gives
each method's mean, spread and per-seed values, every seed's time to the target (recomputed from its curve, at
``--target`` when given), the sync speed-up over the seeds (geometric mean, 95% interval, censored seeds counted:
``RATIO_RULE``), and a plot of the mean curves with their spread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from distrl_stream.artifacts import adapter_dir
from distrl_stream.cli.bench import results_file
from distrl_stream.cli.common import progress_bar
from distrl_stream.collector import run_episode
from distrl_stream.collector.evaluation import EvalResult, evaluate_versions
from distrl_stream.collector.heldout import EvalPlan, report, write_report
from distrl_stream.config import (
    Config,
    EnvConfig,
    InferenceConfig,
    LearnerConfig,
    ModelConfig,
    load_config,
    sync_round_episodes,
)
from distrl_stream.envs.sim import SimEnv
from distrl_stream.envs.tasks import task_pool
from distrl_stream.errors import ConfigError
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode, epoch_ms
from distrl_stream.inference.server import InferenceServer, start_on_cores, unload_all_adapters
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.role import Learner
from distrl_stream.orchestrate import PRETRAINED_UP_PROFILE
from distrl_stream.policy.model import build_model
from distrl_stream.policy.model_dir import pulled_model_dir
from distrl_stream.policy.precision import resolve_precision
from distrl_stream.policy.pretrained import PRETRAINED, pull, sha256_file
from distrl_stream.testing.scripted import ScriptedPolicy

# Sync time-to-target ÷ A-RIDE async's: the paper claims about 3x training efficiency; the bar it is measured against
# is the paper's other figure, its 2.4x collection speed-up over synchronous multi-machine DigiRL.
TARGET_RATIO = 2.4
# The tiny model's default held-out success target (--target).
TARGET_SUCCESS = 0.8
# A pretrained model (--model): the success target is one every compared method reaches: zero-shot plus this share of
# the gap to the lowest best success among them.
TARGET_GAP_SHARE = 0.5
# Chromium environments per MiniWoB++ evaluation (--env miniwob): what bench/learning_miniwob.py runs on 2 cores.
MINIWOB_BROWSERS = 4
CLI = str(Path(sys.executable).with_name("distrl-stream"))
# The repository's default data dir, wherever the script is run from: a pretrained model pulled by `up` is reused.
DATA_DIR = Path(__file__).resolve().parents[1] / "distrl-data"


def repository_model_dir(name: str) -> Path:
    """Where the pretrained model ``name`` is pulled in the repository's data dir (as ``up`` run there pulls it)."""
    return pulled_model_dir(load_config(None, data_dir=DATA_DIR), name)


# Five one-goal templates and three multi-step ones (two goals in one instruction, 3 to 6 right choices).
TEMPLATES = [
    "take_photo",
    "turn_on_setting",
    "alarm_on",
    "create_note",
    "send_message",
    "two_settings",
    "airplane_and_alarm",
    "add_contact_and_call",
]
# The learner's settings shared by every method: the CPU/tiny-model profile of docs/learner.md (the paper's loss,
# entropy bonus and invalid-action penalty at their defaults, plus a critic warm-up and batch-centred advantages,
# which keep A-RIDE from drifting; the baselines ignore all of these).
LEARNER = {
    # 1e-3 learns fastest for a minute and then flips whole templates to 0; 3e-4 holds (docs/learner.md, "Stability").
    "policy_lr": 3e-4,
    # γ 0.9 over the authors' 0.5: A-RIDE's area 0.778 ± 0.090 against 0.710 ± 0.009 over three seeds, final 0.88
    # against 0.70 (docs/learner.md, "γ and DPER's priority, three seeds").
    "gamma": 0.9,
    "critic_lr": 1e-3,
    "critic_warmup_updates": 20,
    "advantage_centering": True,
    "batch_episodes": 8,
    "min_buffer_episodes": 8,
    "updates_per_version": 10,
    "priority_refresh_interval": 100,
    "buffer_capacity_steps": 3000,
    "checkpoint_interval_updates": 100,
    "metrics_interval_s": 5.0,
    "threads": 1,
}
WARM_LR = 3e-3
# The warm start's recipe (--noise, --scripted-episodes, --bc-updates): the scripted policy's random-action
# probability, the episodes it plays, and the behaviour-cloning updates on them.
WARM_RECIPE = {"noise": 0.3, "scripted_episodes": 300, "bc_updates": 600}
# A pretrained model's learner: `up`'s pretrained profile (4-episode batches in one checkpointed pass, lr 1e-4, γ 0.9,
# a critic warm-up of 2 updates) over LEARNER.
PRETRAINED_LEARNER = {**LEARNER, **PRETRAINED_UP_PROFILE["learner"]}
# Learner fields another flag or the bench itself sets for each method: --learner would be overridden, yet recorded.
SET_ELSEWHERE = {
    "algorithm": "--methods, --variant",
    "dtype": "--precision",
    "seed": "--seed",
    "init_adapter": "the warm start",
    "round_episodes": "--envs (a sync round is one episode per env)",
}


def with_learner_changes(profile: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with --learner's ``changes``, checked before anything starts (a method's own changes, an
    ablation's, still win over them).

    Raises:
        SystemExit: a change is to a field set elsewhere (:data:`SET_ELSEWHERE`), or not a valid value.
    """
    if owned := [f"{key} is set by {SET_ELSEWHERE[key]}" for key in changes if key in SET_ELSEWHERE]:
        raise SystemExit(f"--learner: {'; '.join(owned)}")
    changed = {**profile, **changes}
    try:
        load_config(None, learner=changed)
    except ConfigError as exc:
        raise SystemExit(f"--learner: {exc}") from None
    return changed


# Each method: its update rule, its collection mode, and what it changes in LEARNER.
METHODS: dict[str, dict[str, Any]] = {
    "aride_async": {"algorithm": "aride", "mode": "async"},
    "digirl_async": {"algorithm": "digirl", "mode": "async"},
    "filtered_bc_async": {"algorithm": "filtered_bc", "mode": "async"},
    "digirl_sync": {"algorithm": "digirl", "mode": "sync"},
    "aride_no_retrace": {"algorithm": "aride", "mode": "async", "learner": {"retrace_lambda": 0.0}},
    "aride_no_dper": {"algorithm": "aride", "mode": "async", "learner": {"dper_alpha": 0.0}},
    "aride_no_entropy": {"algorithm": "aride", "mode": "async", "learner": {"entropy_coef": 0.0}},
}
# The plot's first panel; every other method (ablations, --variant) is drawn beside aride_async in the second.
BASELINES = ("aride_async", "digirl_async", "filtered_bc_async", "digirl_sync")
# The learner statistics kept per method (from its MetricEvents), to see why a curve moves the way it does.
LEARNER_STATS = (
    "updates",
    "entropy",
    "loss_critic",
    "value_error",
    "advantage_mean",
    "advantage_std",
    "rho_mean",
    "rho_clipped_frac",
    "batch_success",
    "batch_lag_mean",
    "buffer_success",
    "priority_success_share",
)

log = logging.getLogger("bench.learning")


# ------------------------------------------------------------------------------------------------------------------
# The warm start: a noisy scripted policy, recorded into a topic, then behaviour cloning on the replayed topic
# ------------------------------------------------------------------------------------------------------------------


async def record_scripted(cfg: Config, tokenizer: Any, episodes: int, noise: float, seed: int) -> float:
    """Play ``episodes`` train tasks with the scripted policy into ``{cfg.run}.trajectories``; returns its success.

    Everything random comes from ``seed``, episode ids included, so the recorded topic, and the warm start cloned from
    it, are the same in every run with the same flags.
    """
    rng = random.Random(seed)
    tasks = task_pool(cfg.env, "train", 400)
    ensure_run_topics(cfg)
    wins = 0
    with Producer(cfg.kafka, client_id="scripted") as producer:
        for _ in range(episodes):
            env = SimEnv()
            task = rng.choice(tasks)
            policy = ScriptedPolicy(env, tokenizer, noise, rng)
            outcome = await run_episode(env, task, policy, "choice", episode_id=f"{rng.getrandbits(128):032x}")
            wins += outcome.success
            event = outcome.to_event(
                run=cfg.run, collector_id="scripted", mode="choice", base_model=cfg.model.base_model_id
            )
            producer.produce_event(TopicNames(cfg.run).trajectories, event)
        producer.flush()
    return wins / episodes


class WarmStart(NamedTuple):
    """The adapter every method's learner starts from, published as version 1 of the run ``{prefix}-warm``."""

    adapter: Path
    # How it was made, as --save-warm-start writes it beside the adapter: WARM_START_RECIPE_KEYS, among them the
    # sha256 of the tiny model it was cloned on (base_weights_sha256) and of the adapter's own weights.
    recipe: dict[str, Any]


# A saved warm start is these files of the clone's adapter folder and the recipe beside them. The clone's weights
# differ between CPUs for the same recipe and seed (float rounding of another instruction set), so seeds run on two
# machines compare only from one saved warm start (--warm-start).
WARM_START_FILES = ("adapter_model.safetensors", "adapter_config.json")
WARM_START_RECIPE = "recipe.json"
WARM_START_RECIPE_KEYS = (
    "scripted_noise",
    "scripted_episodes",
    "bc_updates",
    "scripted_policy_success",
    "templates",
    "base_weights_sha256",
    "warm_start_weights_sha256",
    "adapter_shape",
)
# What of adapter_config.json decides what the weights compute (the rest names paths, versions): the recipe pins it.
ADAPTER_SHAPE_KEYS = (
    "peft_type",
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "rank_pattern",
    "alpha_pattern",
    "fan_in_fan_out",
    "bias",
    "lora_bias",
    "use_rslora",
    "use_dora",
    "layer_replication",
    "modules_to_save",
)


def adapter_shape(adapter: Path) -> dict[str, Any]:
    """The :data:`ADAPTER_SHAPE_KEYS` of ``adapter``'s adapter_config.json (target modules sorted: peft saves a set)."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    shape = {key: config.get(key) for key in ADAPTER_SHAPE_KEYS}
    if isinstance(shape["target_modules"], list):
        shape["target_modules"] = sorted(shape["target_modules"])
    return shape


def clone_warm_start(
    base: dict[str, Any], *, episodes: int, noise: float, bc_updates: int, base_weights: str
) -> WarmStart:
    """Record the noisy scripted policy into ``{prefix}-scripted`` and clone it into ``{prefix}-warm``, whose version
    1 is the warm start."""
    from transformers import AutoTokenizer

    prefix = base["run"]
    tokenizer = AutoTokenizer.from_pretrained(base["model"]["base"])
    # One partition: the replay then loads the episodes in exactly the order they were played (episodes produced
    # within the same millisecond in different partitions have no order a reader could restore).
    scripted_cfg = load_config(
        None, **{**base, "run": f"{prefix}-scripted", "kafka": {**base["kafka"], "trajectory_partitions": 1}}
    )
    scripted_success = asyncio.run(record_scripted(scripted_cfg, tokenizer, episodes, noise, seed=0))
    # Cloning is supervised: it takes a larger step size than RL (same model, same data format).
    warm_cfg = load_config(
        None, **{**base, "run": f"{prefix}-warm", "learner": {**base["learner"], "policy_lr": WARM_LR}}
    )
    learner = Learner(warm_cfg)
    try:
        learner.start(from_replay=scripted_cfg.run, replay_updates=bc_updates, replay_algorithm="bc")
    finally:
        learner.close()
    adapter = adapter_dir(warm_cfg, 1)
    recipe = {
        "scripted_noise": noise,
        "scripted_episodes": episodes,
        "bc_updates": bc_updates,
        "scripted_policy_success": scripted_success,
        "templates": base["env"]["templates"],
        "base_weights_sha256": base_weights,
        # The adapter's weights alone (its folder also names this run's model path).
        "warm_start_weights_sha256": sha256_file(adapter / "adapter_model.safetensors"),
        "adapter_shape": adapter_shape(adapter),
    }
    return WarmStart(adapter, recipe)


def read_warm_start(saved: Path, templates: list[str]) -> dict[str, Any]:
    """The recipe of the warm start saved in ``saved`` (--save-warm-start), checked before any service starts.

    Raises:
        SystemExit: ``saved`` holds no readable or complete recipe, its adapter (weights, or the fields of its
            configuration in :data:`ADAPTER_SHAPE_KEYS`) is not the one the recipe names, or it was cloned on other
            templates than ``templates``.
    """
    try:
        recipe = json.loads((saved / WARM_START_RECIPE).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--warm-start: no readable {WARM_START_RECIPE} in {saved} ({exc})") from None
    if missing := [key for key in WARM_START_RECIPE_KEYS if key not in recipe]:
        raise SystemExit(f"--warm-start: {saved / WARM_START_RECIPE} lacks {', '.join(missing)}")
    if recipe["templates"] != templates:
        raise SystemExit(
            f"--warm-start: cloned on the templates {','.join(recipe['templates'])}; this run's are "
            f"{','.join(templates)} (--templates)"
        )
    try:
        adapter_sha256 = sha256_file(saved / "adapter_model.safetensors")
        shape = adapter_shape(saved)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--warm-start: {exc}") from None
    if adapter_sha256 != recipe["warm_start_weights_sha256"]:
        raise SystemExit(f"--warm-start: {saved}/adapter_model.safetensors is not the adapter its recipe names")
    if changed := [
        f"{k} {shape[k]} against {recipe['adapter_shape'].get(k)}"
        for k in shape
        if shape[k] != recipe["adapter_shape"].get(k)
    ]:
        raise SystemExit(
            f"--warm-start: {saved}/adapter_config.json is not the one its recipe names ({'; '.join(changed)})"
        )
    return recipe


def load_warm_start(base: dict[str, Any], saved: Path, recipe: dict[str, Any], base_weights: str) -> WarmStart:
    """Publish the warm start saved in ``saved`` (its ``recipe`` read by :func:`read_warm_start`) as version 1 of
    ``{prefix}-warm``.

    Raises:
        SystemExit: it was cloned on another tiny model than the one built here (``base_weights``).
    """
    if recipe["base_weights_sha256"] != base_weights:
        raise SystemExit(
            "--warm-start: cloned on a tiny model whose weights differ from the one built here "
            f"(sha256 {recipe['base_weights_sha256'][:12]}… against {base_weights[:12]}…)"
        )
    learner = Learner(
        load_config(
            None, **{**base, "run": f"{base['run']}-warm", "learner": {**base["learner"], "init_adapter": str(saved)}}
        )
    )
    try:
        learner.start()  # an init_adapter is published as the first version at start
    finally:
        learner.close()
    return WarmStart(saved, recipe)


def save_warm_start(warm: WarmStart, to: Path) -> None:
    """Copy the warm start's adapter files and write its recipe into ``to`` (created; its files replaced)."""
    to.mkdir(parents=True, exist_ok=True)
    for name in WARM_START_FILES:
        (to / name).write_bytes((warm.adapter / name).read_bytes())
    (to / WARM_START_RECIPE).write_text(json.dumps(warm.recipe, indent=2) + "\n")


def evaluate_warm_start(cfg: Config, prefix: str, server_url: str, tasks: list[Any], root: Path) -> EvalResult:
    """The warm start's held-out result: version 1 of ``{prefix}-warm`` on ``tasks``."""
    warm_event = next(
        decode(m.value(), WeightVersionEvent) for m in read_topic(cfg.kafka, TopicNames(f"{prefix}-warm").weights)
    )
    (warm,) = asyncio.run(
        evaluate_versions(cfg, server_url, [warm_event], tasks, staging_dir=root / "staging-warm", concurrency=16)
    )
    return warm


# ------------------------------------------------------------------------------------------------------------------
# Training runs
# ------------------------------------------------------------------------------------------------------------------


def config_env(sections: dict[str, Any]) -> dict[str, str]:
    """``DISTRL_*`` variables for child processes: ``{"learner": {"policy_lr": 1}}`` → ``DISTRL_LEARNER__POLICY_LR``."""
    out = {}
    for key, value in sections.items():
        if isinstance(value, dict):
            for field_name, item in value.items():
                out[f"DISTRL_{key.upper()}__{field_name.upper()}"] = _env_value(item)
        else:
            out[f"DISTRL_{key.upper()}"] = _env_value(value)
    return out


def _env_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict | bool) else str(value)


@dataclass
class TrainRun:
    """What one method did within its budget."""

    method: str
    run: str
    launched: float  # epoch seconds
    versions: list[WeightVersionEvent] = field(default_factory=list)
    trajectories: int = 0
    # Of them, the successes: the rate the learner's batches are drawn from (its batch_success is what it drew).
    collected_successes: int = 0
    learner_updates: int = 0  # behind the last version published within the budget
    learner_stats: list[dict[str, float]] = field(default_factory=list)

    def seconds(self, event: WeightVersionEvent) -> float:
        """When ``event`` was published, from the launch."""
        return epoch_ms(event.created_at) / 1000.0 - self.launched

    def published_within(self, budget_s: float) -> list[WeightVersionEvent]:
        """The versions published within the budget (an update finishing after the stop signal is not the method's)."""
        return [e for e in self.versions if self.seconds(e) <= budget_s]


def train(
    method: str,
    base: dict[str, Any],
    root: Path,
    server_url: str,
    budget_s: float,
    envs: int,
    learner_cores: set[int] | None,
) -> TrainRun:
    """Run one method's learner and collector for ``budget_s`` seconds (with a weight watcher on the server).

    ``learner_cores``: the CPUs the learner process is confined to (None: it shares the bench's).
    """
    spec = METHODS[method]
    run = f"{base['run']}-{method}"
    sections = {
        **base,
        "run": run,
        "learner": {
            **base["learner"],
            **spec.get("learner", {}),
            "algorithm": spec["algorithm"],
        },
        "collector": {
            "envs": envs,
            "mode": spec["mode"],
            "collector_id": f"{method}-c0",
            "shutdown_grace_s": 0.0,
            "version_refresh_s": 0.2,
            "metrics_interval_s": 5.0,
        },
    }
    # One collector process: the same pairing `up --mode sync` makes for its collectors.
    sections["learner"]["round_episodes"] = sync_round_episodes(load_config(None, **sections).collector, 1)
    cfg = load_config(None, **sections)
    ensure_run_topics(cfg)
    watcher = WeightWatcher(cfg, server_url=server_url, catch_up_timeout_s=30.0)
    watcher.start()
    env = {**os.environ, **config_env(sections)}
    log_path = root / f"{method}.log"
    procs = []
    launched = time.time()
    try:
        with log_path.open("ab") as out:
            pin = None if learner_cores is None else (lambda: os.sched_setaffinity(0, learner_cores))
            for args, preexec in ((["learn"], pin), (["collect"], None)):
                procs.append(
                    subprocess.Popen([CLI, *args], env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec)
                )
        began = time.monotonic()
        with progress_bar(f"{method}: training (seconds of the budget)") as update:
            while (elapsed := time.monotonic() - began) < budget_s:
                update(int(elapsed), int(budget_s))
                for proc in procs:
                    if proc.poll() is not None:
                        tail = log_path.read_text(errors="replace")[-3000:]
                        raise RuntimeError(f"{method}: {proc.args[1]} exited {proc.returncode}:\n{tail}")
                if watcher.failed is not None:
                    raise RuntimeError(f"{method}: weight watcher failed: {watcher.failed}")
                time.sleep(1.0)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        watcher.stop()
        unload_all_adapters(server_url, api_key=cfg.inference.api_key)  # the next method's versions start at 1 again
    topics = TopicNames(run)
    versions = [decode(m.value(), WeightVersionEvent) for m in read_topic(cfg.kafka, topics.weights)]
    result = TrainRun(method, run, launched, sorted(versions, key=lambda e: e.version))
    outcomes = [decode(m.value(), TrajectoryEvent).success for m in read_topic(cfg.kafka, topics.trajectories)]
    result.trajectories, result.collected_successes = len(outcomes), sum(outcomes)
    result.learner_updates = max((e.learner_step for e in result.published_within(budget_s)), default=0)
    for msg in read_topic(cfg.kafka, topics.metrics):
        metric = decode(msg.value(), MetricEvent)
        if metric.role == "learner" and "updates" in metric.values:
            seconds = metric.timestamp.timestamp() - launched
            kept = {k: metric.values[k] for k in LEARNER_STATS if k in metric.values}
            result.learner_stats.append({"seconds": round(seconds, 1), **kept})
    log.info(
        "%s: %d versions, %d trajectories (%d successes) in %.0fs",
        method,
        len(versions),
        result.trajectories,
        result.collected_successes,
        budget_s,
    )
    return result


class Services(NamedTuple):
    """What ``local_services`` started: the model folder, the broker's bootstrap servers, the server's URL and the
    server itself (None when the bench uses a running one)."""

    model_dir: Path
    bootstrap: str
    url: str
    server: InferenceServer | None


@contextlib.contextmanager
def local_services(
    root: Path, inference_url: str | None = None, pretrained: str | None = None, dtype: str = "auto"
) -> Iterator[Services]:
    """The tiny model (or the ``pretrained`` one, pulled into the repository's data dir and served as ``up``'s
    pretrained profile serves it), an embedded broker and a vLLM server on the model (or ``inference_url``) in
    ``dtype`` (``inference.dtype``), under ``root``. Both services stop on the way out, whatever happened.
    """
    if pretrained is None:
        model_dir = build_model(root / "tiny", "tiny", seed=0)
        inference = InferenceConfig(port=0, startup_timeout_s=300.0, dtype=dtype)
    else:
        model_dir = pull(pretrained, repository_model_dir(pretrained))
        inference = InferenceConfig(
            port=0, startup_timeout_s=600.0, **{**PRETRAINED_UP_PROFILE["inference"], "dtype": dtype}
        )
    broker = EmbeddedBroker.from_config(load_config(None, data_dir=root / "data"))
    bootstrap = broker.start()
    server = InferenceServer(model_dir, inference, ModelConfig(), root / "vllm.log")
    try:
        if inference_url is None:
            server.start()
        yield Services(model_dir, bootstrap, inference_url or server.url, None if inference_url else server)
    finally:
        server.stop()
        broker.stop()


def split_cores(*, shared: bool) -> tuple[set[int] | None, set[int] | None]:
    """The learner's CPUs and everyone else's: one core of its own, as if on its own machine (None, None: shared).

    DistRL's learner runs on its own GPU while workers collect; on one two-core machine, confining the learner to one
    core and inference + collectors to the rest is the same split for every method. Without it, the asynchronous
    methods' learner competes with collection for the same cores, which only a single machine would impose.
    """
    cores = sorted(os.sched_getaffinity(0))
    if shared or len(cores) < 2:
        return None, None
    return {cores[0]}, set(cores[1:])


def serve_evaluations_on_every_core(
    services: Services, learner_cores: set[int] | None, serving_cores: set[int] | None
) -> list[int] | None:
    """Once training is over, restart the bench's own server (same port, so the same URL) and move the bench (its
    environments) onto the learner's and the serving cores together; returns the cores evaluation runs on, or None
    when nothing moved (shared cores, or a server the bench did not start).

    vLLM on CPU binds its compute threads when it starts, to the cores it may use less one kept for its scheduler:
    started on the serving core alone, the server computes, schedules and shares that core with the environments
    while the learner's core idles through the evaluations. If it does not start on every core, it is started on the
    serving cores again rather than losing the trained methods.
    """
    if services.server is None or learner_cores is None or serving_cores is None:
        return None
    services.server.stop()
    return start_on_cores(services.server, learner_cores | serving_cores, fallback=serving_cores)


def pick_versions(run: TrainRun, budget_s: float, points: int) -> list[WeightVersionEvent]:
    """At most ``points`` versions published within the budget, evenly spaced in time, always the first and last."""
    inside = run.published_within(budget_s)
    if len(inside) <= points:
        return inside
    chosen = {0, len(inside) - 1}
    for k in range(1, points - 1):
        target = budget_s * k / (points - 1)
        chosen.add(min(range(len(inside)), key=lambda i: abs(run.seconds(inside[i]) - target)))
    return [inside[i] for i in sorted(chosen)]


async def evaluate_curve(
    cfg: Config,
    server_url: str,
    staging: Path,
    run: TrainRun,
    picked: list[WeightVersionEvent],
    tasks: list[Any],
    concurrency: int = 16,
) -> tuple[list[dict[str, Any]], list[EvalResult]]:
    """Held-out success of each picked version, in ascending order, on the evaluation server (``concurrency``
    environments at a time): the curve's points and each version's whole result (:func:`write_eval_reports`)."""
    curve: list[dict[str, Any]] = []
    results: list[EvalResult] = []

    def add_point(result: EvalResult) -> None:
        event = picked[len(curve)]
        results.append(result)
        curve.append(
            {
                "version": event.version,
                "seconds": run.seconds(event),
                "learner_step": event.learner_step,
                "trajectories_consumed": event.trajectories_consumed,
                "success": result.success_rate,
                "by_template": result.by_template,
            }
        )
        update(len(curve), len(picked))
        log.info("%s v%d @%.0fs: %.2f", run.method, event.version, run.seconds(event), result.success_rate)

    with progress_bar(f"{run.method}: evaluating versions") as update:
        update(0, len(picked))
        await evaluate_versions(
            cfg, server_url, picked, tasks, staging_dir=staging, concurrency=concurrency, on_result=add_point
        )
    return curve, results


def write_eval_reports(
    cfg: Config,
    out: Path,
    untrained: EvalResult,
    results: dict[str, list[EvalResult]],
    plan: EvalPlan,
    server_url: str,
) -> list[Path]:
    """``distrl-stream eval``'s report of each method's evaluations, zero-shot (version 0) first: JSON and Markdown
    beside ``out`` (``<stem>_eval_<method>.json``/``.md``), with the per-template and per-task counts, errors and
    episode lengths behind the result file's numbers. Returns the JSON files."""
    written = []
    for method, method_results in results.items():
        data = report(cfg, plan, [untrained, *method_results], server_url) | {"run": f"{cfg.run}-{method}"}
        written.append(write_report(data, out.with_name(f"{out.stem}_eval_{method}.json"))[0])
    return written


def sync_speedup(times: dict[str, float | None], target: float | None) -> tuple[float | None, str | None]:
    """``digirl_sync`` time-to-target ÷ ``aride_async`` time-to-target, or None and why: a missing arm, no target
    (None), or a method that never reached it has no time to divide (counting it as the whole budget made the ratio
    an artifact of the budget)."""
    missing = [m for m in ("digirl_sync", "aride_async") if m not in times]
    if missing:
        return None, f"no {' and no '.join(missing)} arm in this run"
    if target is None:
        return None, "a compared method never rose above zero-shot: no target every method reaches"
    never = [m for m in ("digirl_sync", "aride_async") if times[m] is None]
    if never:
        return None, f"{' and '.join(never)} never reached {target:.0%} within the budget"
    sync_t, async_t = times["digirl_sync"], times["aride_async"]
    assert sync_t is not None and async_t is not None
    return sync_t / async_t, None


def time_to(curve: list[dict[str, Any]], target: float, held: int = 1) -> float | None:
    """Seconds until the first evaluated version at or above ``target`` whose next ``held`` − 1 evaluated versions
    are too (None: never within the budget). ``held`` 2 is the stricter reading: one evaluation of 40 tasks has a
    standard error of 0.063 at a success of 0.8, so a single point can cross the target by noise, and an arm with
    more points evaluated has more chances to."""
    if held < 1:
        raise ValueError(f"held must be at least 1, not {held}")
    return next(
        (
            curve[i]["seconds"]
            for i in range(len(curve) - held + 1)
            if all(p["success"] >= target for p in curve[i : i + held])
        ),
        None,
    )


def with_zero_shot(curve: list[dict[str, Any]], zero_shot: EvalResult) -> list[dict[str, Any]]:
    """``curve`` after version 0, the base model, which every method serves from 0 s until its first version is
    published: the area then gives no credit for a change before it happened."""
    point = {"version": 0, "learner_step": 0, "trajectories_consumed": 0}
    point |= {"success": zero_shot.success_rate, "by_template": zero_shot.by_template}
    held = [{**point, "seconds": 0.0}]
    if curve:  # until the first version (without one, the base model is served for the whole budget)
        held.append({**point, "seconds": curve[0]["seconds"]})
    return held + curve


def reachable_target(trained: dict[str, list[dict[str, Any]]], zero_shot: float) -> float | None:
    """A success target every compared method reaches: zero-shot plus ``TARGET_GAP_SHARE`` of the gap to the lowest
    best success among the methods of :data:`BASELINES` in the run (all of them when none is); None when one of them
    never rose above zero-shot."""
    compared = [m for m in trained if m in BASELINES] or list(trained)
    lowest_best = min(max((p["success"] for p in trained[m]), default=zero_shot) for m in compared)
    return zero_shot + TARGET_GAP_SHARE * (lowest_best - zero_shot) if lowest_best > zero_shot else None


def area_under(curve: list[dict[str, Any]], budget_s: float) -> float | None:
    """Mean held-out success over ``[0, budget_s]``: trapezoids between points, flat before the first and after the
    last (so 1.0 only for a method at 100% from the start)."""
    if not curve:
        return None
    points = [(0.0, curve[0]["success"])] + [(min(p["seconds"], budget_s), p["success"]) for p in curve]
    points.append((budget_s, curve[-1]["success"]))
    area = sum((t1 - t0) * (s0 + s1) / 2 for (t0, s0), (t1, s1) in itertools.pairwise(points))
    return area / budget_s


def plot_panels(methods: list[str]) -> dict[str, list[str]]:
    """:func:`plot`'s panels, titled: the baselines that ran, and A-RIDE beside its ablations and variants where any
    ran (without them that panel would only repeat A-RIDE's curve)."""
    panels = {"methods (same start)": [m for m in methods if m in BASELINES]}
    if variants := [m for m in methods if m not in BASELINES]:
        panels["A-RIDE: ablations and variants"] = [m for m in methods if m == "aride_async"] + variants
    return {title: shown for title, shown in panels.items() if shown}


def plot(
    curves: dict[str, list[dict[str, Any]]],
    untrained: float,
    target: float | None,
    budget_s: float,
    where: str,
    path: Path,
) -> None:
    """Held-out success over wall-clock time on ``where`` (e.g. "8 sim templates"): the methods on the left, A-RIDE
    and its ablations on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_panels(list(curves))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), sharey=True, squeeze=False)
    for ax, (title, methods) in zip(axes[0], panels.items(), strict=True):
        for method in methods:
            curve = curves[method]
            ax.plot([p["seconds"] / 60 for p in curve], [p["success"] for p in curve], marker="o", label=method)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
        ax.axhline(untrained, color="black", linestyle=":", linewidth=1, label="untrained (zero-shot)")
        ax.set_xlim(0, budget_s / 60)
        ax.set_ylim(0, 1)
        ax.set_xlabel("wall-clock minutes since launch")
        ax.set_title(title)
        ax.legend(loc="best", fontsize=8)
    axes[0][0].set_ylabel("held-out success")
    fig.suptitle(f"Held-out success over time ({where}, same budget, same envs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------------
# Seeds: one invocation per seed, combined afterwards
# ------------------------------------------------------------------------------------------------------------------

# Per method, what a seed's run reports and the combined file summarises (mean, spread, every seed's value). The time
# to target is not among them: it is recomputed from every file's curve at the combined target.
# Per method and seed; trajectories (episodes collected within the budget) is the data side of a sync speed-up,
# collected_successes how many of them succeeded (what a learner's batches can hold; a file written before lacks it).
SEED_METRICS = (
    "auc",
    "final_success",
    "best_success",
    "learner_updates",
    "versions_published",
    "trajectories",
    "collected_successes",
)
# What a result file holds one of per method: a seed's files are united on these (merge_seeds).
PER_METHOD_METRICS = (*SEED_METRICS, "curves", "method_settings", "learner_stats", "time_to_target_s", "reached_target")
# What combined files must share besides the warm start and the latency model: what a curve depends on but its seed.
SHARED_SETTINGS = ("env", "model", "budget_s_per_method", "eval_tasks", "templates", "envs", "learner", "precision")
SPEEDUP_KINDS = ("exact", "lower_bound", "upper_bound", "unknown", "at_start")
RATIO_RULE = (
    "Per seed, digirl_sync's time to target ÷ the async method's (seconds from launch to the first evaluated version "
    "at or above the target). Censored seeds are counted, never dropped: a sync arm that never reached the target "
    "within the budget B while the async one took t enters at B/t, a lower bound (held at two evaluations: B is the "
    "first of the last points if they are at the target, which the next evaluation might have held; the mean and "
    "its interval are then "
    "lower bounds too: lower_bound true). An async arm that never reached it while sync took t (ratio < t/B), neither "
    "reaching it (unknown), or a curve whose first point, the starting policy, is already at the target (it would "
    "measure publishing, not learning) makes the mean null with those seeds named: no value for them keeps the mean "
    "a lower bound; combine again at another --target. Geometric mean over the seeds; 95% interval: Student's t "
    "interval on the log ratios (n − 1 degrees of freedom), exponentiated; none with one seed."
)


def resolved_precision(run: dict[str, Any]) -> str:
    """The precision a file's run computed in: ``precision_resolved`` (what ``auto`` became on the machine that ran
    it), else the setting; ``auto`` for a file written before the choice was recorded, which compares only with
    files as unknown as itself."""
    metrics = run["metrics"]
    return metrics.get("precision_resolved", metrics.get("precision"))


def shared_setting(run: dict[str, Any], setting: str) -> Any:
    """A file's :data:`SHARED_SETTINGS` entry as seeds are compared on it: the precision as computed, not as asked, so
    that ``--precision float32`` and ``auto`` on a CPU without bf16 units match and ``auto`` on two kinds of CPU does
    not (the recorded learner profile never holds ``dtype``: ``--precision`` sets it)."""
    if setting == "precision":
        return resolved_precision(run)
    return run["metrics"].get(setting, "sim" if setting == "env" else None)  # before --env: sim runs


def file_target(run: dict[str, Any]) -> float | None:
    """The held-out success target a result file measured its times at: ``target_success`` (None: a pretrained run
    with no target every method reaches), or 0.8 in the tiny model's files written before it was recorded (their
    ``time_to_80_s``)."""
    return run["metrics"].get("target_success", TARGET_SUCCESS)


def latency_setting(run: dict[str, Any]) -> dict[str, Any] | None:
    """A file's sim latency model as seeds are compared on it (None: MiniWoB++). Files written before ``sigma`` was
    recorded ran EnvConfig's default, unchanged since the simulator was written (the bench did not set it)."""
    latency = run["metrics"].get("latency")
    if latency is None:
        return None
    sigma = latency.get("sigma", EnvConfig.model_fields["latency_sigma"].default)
    return {
        "model": latency["model"],
        "mean_s": latency["mean_s"],
        "sigma": sigma,
        "task_spread": latency["task_spread"],
    }


def describe_latency(latency: dict[str, Any]) -> str:
    """The sim's step-latency model (``distrl_stream.envs.sim.env.LatencyModel``) in words, with its parameters
    (``mean_s``, ``sigma``, ``task_spread``)."""
    mean_s, sigma, task_spread = latency["mean_s"], latency["sigma"], latency["task_spread"]
    return (
        f"log-normal: a step sleeps {mean_s} s × the task's scale × exp(σZ − σ²/2), σ = {sigma}, Z standard normal "
        f"(noise of mean 1); a task's scale is fixed by the task and the env seed, log-uniform over a {task_spread:g}x "
        f"range (slowest ÷ fastest) and normalised to mean 1, so a step takes {mean_s} s on average over tasks"
    )


def seed_speedup(
    sync_curve: list[dict[str, Any]],
    async_curve: list[dict[str, Any]],
    target: float,
    budget_s: float,
    held: int = 1,
) -> dict[str, Any]:
    """One seed's sync ÷ async time to ``target`` (held for ``held`` evaluations: :func:`time_to`) and how far it is
    known (:data:`RATIO_RULE`): ``kind`` exact, lower_bound (sync never reached it: ``ratio`` = the earliest it can
    still have ÷ async time), upper_bound (async never did: sync time ÷ the earliest it can still have), unknown
    (neither did) or at_start (a curve holds the target from its first point), with ``ratio`` None for the last two.
    """
    sync_s, async_s = time_to(sync_curve, target, held), time_to(async_curve, target, held)
    entry: dict[str, Any] = {"sync_s": sync_s, "async_s": async_s}
    if any(curve and t == curve[0]["seconds"] for curve, t in ((sync_curve, sync_s), (async_curve, async_s))):
        return entry | {"kind": "at_start", "ratio": None}
    if sync_s is not None and async_s is not None:
        return entry | {"kind": "exact", "ratio": sync_s / async_s}
    if async_s is not None:
        return entry | {"kind": "lower_bound", "ratio": censored_at(sync_curve, target, budget_s) / async_s}
    if sync_s is not None:
        return entry | {"kind": "upper_bound", "ratio": sync_s / censored_at(async_curve, target, budget_s)}
    return entry | {"kind": "unknown", "ratio": None}


def censored_at(curve: list[dict[str, Any]], target: float, budget_s: float) -> float:
    """The earliest time to target a curve that never held it can still have: the budget, or, when its last points
    are at or above the target but too few to count as held, the first of them (the next evaluation, after the
    budget, might have held it)."""
    trailing = list(itertools.takewhile(lambda p: p["success"] >= target, reversed(curve)))
    return trailing[-1]["seconds"] if trailing else budget_s


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` ≥ 1 degrees of freedom (a two-sided 95% interval's half-width in standard
    errors): bisection on the closed form of P(|T| ≤ t) for an integer df (Abramowitz & Stegun 26.7.3-4), since
    scipy is not a dependency."""

    def central(t: float) -> float:
        theta = math.atan(t / math.sqrt(df))
        c2 = math.cos(theta) ** 2
        odd = df % 2 == 1
        term, series = 1.0, 0.0
        for k in range(1, (df - 1) // 2 + 1 if odd else df // 2 + 1):
            series += term
            term *= (2 * k / (2 * k + 1) if odd else (2 * k - 1) / (2 * k)) * c2
        if odd:
            return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
        return math.sin(theta) * series

    low, high = 0.0, 1000.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if central(middle) < 0.95 else (low, middle)
    return (low + high) / 2


def geometric_mean_ci(ratios: list[float]) -> tuple[float, tuple[float, float] | None]:
    """Geometric mean of ``ratios`` and its 95% interval: Student's t interval on the logs, exponentiated (None with a
    single ratio: no spread to measure)."""
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(centre), None
    half = t_quantile_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre), (math.exp(centre - half), math.exp(centre + half))


def speedup_over_seeds(method: str, seeds: list[int], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``method``'s :func:`seed_speedup` entries, one per seed, counted by kind, and their geometric mean and interval,
    or None with the seeds that leave it unknown (:data:`RATIO_RULE`)."""
    counts = {kind: sum(e["kind"] == kind for e in entries) for kind in SPEEDUP_KINDS}
    blocking = {
        "upper_bound": f"{method} never reached the target within the budget while digirl_sync did",
        "unknown": f"neither {method} nor digirl_sync reached the target within the budget",
        "at_start": "a starting policy was already at the target",
    }
    reasons = [
        f"{why} (seed {', '.join(str(s) for s, e in zip(seeds, entries, strict=True) if e['kind'] == kind)})"
        for kind, why in blocking.items()
        if counts[kind]
    ]
    summary: dict[str, Any] = {
        "per_seed": [{"seed": s, **e} for s, e in zip(seeds, entries, strict=True)],
        "counts": counts,
        "geometric_mean": None,
        "ci95": None,
        "lower_bound": None,
        "reason": "; ".join(reasons) or None,
    }
    if reasons:
        return summary
    mean, interval = geometric_mean_ci([e["ratio"] for e in entries])
    return summary | {"geometric_mean": mean, "ci95": interval, "lower_bound": counts["lower_bound"] > 0}


def area_against(auc: dict[str, dict[str, Any]], baseline: str) -> dict[str, Any]:
    """A-RIDE async's mean area under the curve against ``baseline``'s mean − standard deviation over seeds (the
    criterion: at least that); ``holds`` None when there is no spread (one seed)."""
    ours, theirs = auc["aride_async"], auc[baseline]
    bar = None if theirs["std"] is None else theirs["mean"] - theirs["std"]
    return {
        "aride_async_mean": ours["mean"],
        "baseline_mean_minus_std": bar,
        "holds": None if bar is None or ours["mean"] is None else ours["mean"] >= bar,
    }


def spread(values: list[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation of the known (not None) ``values``, and the values themselves."""
    known = [v for v in values if v is not None]
    return {
        "mean": statistics.fmean(known) if known else None,
        "std": statistics.stdev(known) if len(known) > 1 else None,
        "values": values,
    }


def merge_seeds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run a seed, in the order of their first files: a seed's files (one invocation a method, or a later one adding
    baselines at the same settings) united on :data:`PER_METHOD_METRICS`, each method from the one file that ran it (a
    metric some of them lack is left out, as :func:`combine` leaves out one a seed lacks); the rest is the seed's
    first file's, but the start's success (zero-shot and the warm start), the mean of the files' own evaluations of
    it."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        by_seed.setdefault(run["metrics"].get("seed", 0), []).append(run)
    merged = []
    for seed, files in by_seed.items():
        methods = [m for run in files for m in run["metrics"]["curves"]]
        if repeated := sorted({m for m in methods if methods.count(m) > 1}):
            raise SystemExit(f"--combine: seed {seed}'s files repeat a method ({', '.join(repeated)})")
        if len(files) == 1:
            merged.append(files[0])
            continue
        metrics = dict(files[0]["metrics"])
        for key in PER_METHOD_METRICS:
            if all(key in run["metrics"] for run in files):
                metrics[key] = {m: v for run in files for m, v in run["metrics"][key].items()}
            else:
                metrics.pop(key, None)
        for start in ("untrained_success", "warm_start_success"):
            if metrics.get(start) is not None:
                metrics[start] = statistics.fmean(run["metrics"][start] for run in files)
        merged.append(files[0] | {"quick": any(run["quick"] for run in files), "metrics": metrics})
    return merged


def combine(files: list[Path], out: Path, target: float | None = None) -> dict[str, Any]:
    """Combine result files (same settings, latency model and warm start; a seed's methods in one file or several,
    :func:`merge_seeds`; the methods every seed ran are compared) into ``out``: per method and metric the mean, the
    sample standard deviation and each seed's value; each seed's time to ``target`` (None: the files' own target,
    which they must share), recomputed from its curve; every async method's sync speed-up over the seeds
    (:data:`RATIO_RULE`), A-RIDE's being the headline ``ratio``; and the plot of :func:`plot_combined`."""
    runs = [json.loads(f.read_text()) for f in files]
    if len({r["metrics"].get("warm_start_weights_sha256") for r in runs}) != 1:
        raise SystemExit("--combine: the files do not share one warm start")
    # Files written before the base model's weights were recorded are left out of this check.
    if len({r["metrics"].get("base_weights_sha256") for r in runs} - {None}) > 1:
        raise SystemExit("--combine: the files' tiny models differ (base_weights_sha256)")
    for setting in SHARED_SETTINGS:
        if len({json.dumps(shared_setting(r, setting), sort_keys=True) for r in runs}) != 1:
            raise SystemExit(f"--combine: the files differ in {setting}")
    latencies = {json.dumps(latency_setting(r), sort_keys=True) for r in runs}
    if len(latencies) != 1:
        raise SystemExit(f"--combine: the files differ in their latency model ({', '.join(sorted(latencies))})")
    if target is None:
        targets = {file_target(r) for r in runs}
        if len(targets) != 1:
            raise SystemExit(
                f"--combine: the files differ in target_success ({', '.join(map(str, targets))}): give --target to "
                "recompute every file's time to target at one"
            )
        (target,) = targets
        target_note = "the files' own target"
    else:
        target_note = "given to --combine: every file's time to target recomputed from its curve"

    # Every file evaluated zero-shot on its own: all of them count, merged seeds or not.
    untrained = spread([r["metrics"]["untrained_success"] for r in runs])
    runs = merge_seeds(runs)
    methods = [m for m in runs[0]["metrics"]["auc"] if all(m in r["metrics"]["auc"] for r in runs)]
    seeds = [r["metrics"].get("seed", 0) for r in runs]
    budget = runs[0]["metrics"]["budget_s_per_method"]
    curves = {m: [r["metrics"]["curves"][m] for r in runs] for m in methods}
    times = {m: [None if target is None else time_to(c, target) for c in curves[m]] for m in methods}
    async_methods = [m for m in methods if runs[0]["metrics"]["method_settings"][m]["mode"] == "async"]
    speedups: dict[str, dict[str, Any]] = {}
    speedups_held: dict[str, dict[str, Any]] = {}
    if target is None:
        missing = "a file has no target every method reaches: give --target"
    elif "digirl_sync" not in methods:
        missing = "no digirl_sync arm in every file"
    else:
        for held, into in ((1, speedups), (2, speedups_held)):
            for m in async_methods:
                pairs = zip(curves["digirl_sync"], curves[m], strict=True)
                into[m] = speedup_over_seeds(m, seeds, [seed_speedup(s, a, target, budget, held) for s, a in pairs])
        missing = None if "aride_async" in speedups else "no aride_async arm in every file"
    headline = speedups.get("aride_async", {})

    reported = [metric for metric in SEED_METRICS if all(metric in r["metrics"] for r in runs)]
    summaries = {metric: {m: spread([r["metrics"][metric][m] for r in runs]) for m in methods} for metric in reported}
    latency = latency_setting(runs[0])
    metrics: dict[str, Any] = {
        "seeds": seeds,
        "files": [f.name for f in files],
        **summaries,
        "target_success": target,
        "target_note": target_note,
        # Mean and spread over the seeds that reached the target; reached_target counts them.
        "time_to_target_s": {m: spread(times[m]) for m in methods},
        "reached_target": {m: sum(t is not None for t in times[m]) for m in methods},
        "ratio_note": RATIO_RULE,
        "ratio_ci95": headline.get("ci95"),
        "ratio_lower_bound": headline.get("lower_bound"),
        # Each seed's value and whether it is exact, a bound or none (RATIO_RULE).
        "ratio_per_seed": [e["ratio"] for e in headline.get("per_seed", [])],
        "ratio_kind_per_seed": [e["kind"] for e in headline.get("per_seed", [])],
        "sync_speedup": speedups,
        # The same with the target held at two evaluations in a row (time_to's held 2): robust to one noisy point.
        "sync_speedup_held_twice": speedups_held,
        "aride_area_against": {
            m: area_against(summaries["auc"], m)
            for m in ("digirl_async", "filtered_bc_async")
            if {m, "aride_async"} <= set(methods)
        },
        "latency": None if latency is None else latency | {"note": describe_latency(latency)},
        "method_settings": {m: runs[0]["metrics"]["method_settings"][m] for m in methods},
        "warm_start_success": runs[0]["metrics"]["warm_start_success"],
        "untrained_success": untrained,
        "budget_s_per_method": budget,
        "eval_tasks": runs[0]["metrics"]["eval_tasks"],
        "env": runs[0]["metrics"].get("env", "sim"),
        "templates": runs[0]["metrics"]["templates"],
    }
    result = {
        "name": "learning",
        "quick": any(r["quick"] for r in runs),
        "ratio": headline.get("geometric_mean"),
        "ratio_reason": missing or headline.get("reason"),
        "target": TARGET_RATIO,
        "metrics": metrics,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot_combined(runs, methods, target, out.with_suffix(".png"))
    return result


def mean_band(curves: list[list[dict[str, Any]]], grid: list[float]) -> tuple[list[float], list[float]]:
    """Mean and sample standard deviation over seeds of held-out success at each time of ``grid`` (0 std with one
    seed). Seeds evaluate at different times, so each curve is read linearly between its points and flat before the
    first and after the last, as :func:`area_under` reads it; empty curves (no version published) are left out."""
    values = np.array([np.interp(grid, [p["seconds"] for p in c], [p["success"] for p in c]) for c in curves if c])
    std = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros(len(grid))
    return values.mean(axis=0).tolist(), std.tolist()


def plot_combined(runs: list[dict[str, Any]], methods: list[str], target: float | None, path: Path) -> None:
    """Held-out success over wall-clock time over the seeds: on top every method's mean and a band of ± one standard
    deviation, with the target; below, one panel per method with every seed's curve, titled with its mean area."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    rows = -(-len(methods) // columns)
    fig = plt.figure(figsize=(4 * columns, 5 + 3.2 * rows))
    layout = fig.add_gridspec(1 + rows, columns, height_ratios=[5] + [3.2] * rows)
    budget = runs[0]["metrics"]["budget_s_per_method"]
    # Every seed evaluates its own start (other held-out episodes): the line is their mean, not the first seed's.
    key = "untrained_success" if runs[0]["metrics"]["warm_start_success"] is None else "warm_start_success"
    start = statistics.fmean(run["metrics"][key] for run in runs)
    where = "zero-shot" if key == "untrained_success" else "the warm start"
    where += f", mean over seeds ({start:.2f})"
    grid = [budget * i / 240 for i in range(241)]
    top = fig.add_subplot(layout[0, :])
    for method in methods:
        curves = [run["metrics"]["curves"][method] for run in runs]
        if not any(curves):
            continue
        mean, std = mean_band(curves, grid)
        (line,) = top.plot([t / 60 for t in grid], mean, label=method)
        low = [max(0.0, m - s) for m, s in zip(mean, std, strict=True)]
        high = [min(1.0, m + s) for m, s in zip(mean, std, strict=True)]
        top.fill_between([t / 60 for t in grid], low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    if target is not None:
        top.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    top.axhline(start, color="black", linestyle=":", linewidth=1, label=where)
    top.set_xlim(0, budget / 60)
    top.set_ylim(0, 1)
    top.set_xlabel("wall-clock minutes since launch")
    top.set_ylabel("held-out success")
    top.set_title(f"mean over {len(runs)} seeds, band ± 1 standard deviation (each seed linear between its versions)")
    top.legend(loc="best", fontsize=8)
    for index, method in enumerate(methods):
        ax = fig.add_subplot(layout[1 + index // columns, index % columns])
        for run in runs:
            curve = run["metrics"]["curves"][method]
            ax.plot([p["seconds"] / 60 for p in curve], [p["success"] for p in curve], color="grey", linewidth=0.8)
        auc = [run["metrics"]["auc"][method] for run in runs if run["metrics"]["auc"][method] is not None]
        ax.set_title(f"{method}: auc {sum(auc) / len(auc):.2f}" if auc else method, fontsize=9)
        ax.axhline(start, color="black", linestyle=":", linewidth=1)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, budget / 60)
        ax.set_ylim(0, 1)
    seeds = ", ".join(str(r["metrics"].get("seed", 0)) for r in runs)
    fig.suptitle(f"Held-out success over time (seeds {seeds}; below, one line per seed; dotted: {where})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------------


def success_rate(text: str) -> float:
    """A held-out success target: a fraction in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a success rate in (0, 1]")
    return value


def parse_learner_fields(text: str) -> dict[str, Any]:
    """``FIELD=VALUE,…`` → learner fields; values are JSON where they parse (numbers, null, true)."""
    settings: dict[str, Any] = {}
    for assignment in filter(None, text.split(",")):
        key, sep, raw = assignment.partition("=")
        if not sep or key not in LearnerConfig.model_fields:
            raise argparse.ArgumentTypeError(f"{assignment!r}: expected FIELD=VALUE with a [learner] field")
        try:
            settings[key] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key] = raw
    if not settings:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE,…")
    return settings


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:FIELD=VALUE,…`` → (name, learner fields) (:func:`parse_learner_fields`). ``algorithm`` is a learner
    field too: ``algorithm=digirl`` makes a variant of DigiRL async."""
    name, _, assignments = text.partition(":")
    if not name or not assignments:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME:FIELD=VALUE,…")
    settings = parse_learner_fields(assignments)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):  # it ends the variant's run name, which topic names are made of
        raise argparse.ArgumentTypeError(f"{name!r}: a variant's NAME takes letters, digits, _ and - only")
    return name, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="90 s per method and fewer evaluation tasks")
    parser.add_argument("--budget", type=float, help="seconds per method (default 90 quick, 300 full)")
    parser.add_argument("--envs", type=int, help="K: environments of the collector (default 16; 4 with --model)")
    parser.add_argument("--latency-mean", type=float, default=0.5, help="mean sim step latency in seconds")
    parser.add_argument(
        "--latency-sigma",
        type=float,
        default=EnvConfig.model_fields["latency_sigma"].default,
        help="log-normal width of a step's latency around its task's scale (env.latency_sigma)",
    )
    parser.add_argument(
        "--latency-spread",
        type=float,
        default=EnvConfig.model_fields["latency_task_spread"].default,
        help="slowest ÷ fastest task's latency scale (env.latency_task_spread; 1: every task alike)",
    )
    parser.add_argument(
        "--target",
        type=success_rate,
        help=f"held-out success target of the time to target (default {TARGET_SUCCESS}; not with --model, whose "
        "target is one every method reaches); with --combine, every file's time to target is recomputed at it",
    )
    parser.add_argument("--eval-tasks", type=int, help="held-out tasks per evaluation (default 40 quick, 80 full)")
    parser.add_argument("--points", type=int, default=8, help="versions evaluated per method")
    parser.add_argument(
        "--noise", type=float, help=f"scripted policy's random-action probability (default {WARM_RECIPE['noise']})"
    )
    parser.add_argument(
        "--scripted-episodes",
        type=int,
        help=f"episodes of the scripted policy (default {WARM_RECIPE['scripted_episodes']})",
    )
    parser.add_argument(
        "--bc-updates",
        type=int,
        help=f"behaviour-cloning updates of the warm start (default {WARM_RECIPE['bc_updates']})",
    )
    parser.add_argument(
        "--warm-start",
        type=Path,
        metavar="DIR",
        help="start every method from this saved warm start (--save-warm-start) instead of cloning one: seeds run on "
        "other machines then share it (a clone's weights differ between CPUs)",
    )
    parser.add_argument(
        "--save-warm-start", type=Path, metavar="DIR", help="save the warm start (adapter and recipe) into DIR"
    )
    parser.add_argument(
        "--inference-url", help="use this running vLLM server (serving the bench's model as it would) instead of one"
    )
    parser.add_argument(
        "--model",
        choices=sorted(PRETRAINED),
        help="RL fine-tuning of this pretrained model (pulled on first use) from its zero-shot policy: chat prompts, "
        "no warm start, `up`'s pretrained profile for the learner and the server (see PRETRAINED_LEARNER)",
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument(
        "--learner",
        type=parse_learner_fields,
        default={},
        metavar="FIELD=VALUE,…",
        help="change these learner fields for every method, variants included, not the warm start's clone (e.g. "
        "policy_lr=1e-4); a method's own changes (an ablation's) still win; the results file records them",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=parse_variant,
        metavar="NAME:FIELD=VALUE,…",
        help="also run A-RIDE async with these learner fields changed (repeatable; e.g. lr3e-4:policy_lr=3e-4; "
        "algorithm=digirl for DigiRL async)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the methods' learners and of their task sampling and latency; the warm start and the held-out "
        "tasks are the same for every seed (one warm start, seeds compared on the same tasks)",
    )
    parser.add_argument("--templates", help="comma-separated sim templates (default: all eight)")
    parser.add_argument(
        "--precision",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="the server's and every learner's precision (inference.dtype, learner.dtype): bf16 or float32 end to end",
    )
    parser.add_argument(
        "--env",
        choices=("sim", "miniwob"),
        default="sim",
        help="the simulator's templates, or the MiniWoB++ subset in headless chromium (with --model only: the tiny "
        "model's warm start is scripted on the simulator; bench/learning_miniwob.py runs the tiny model there)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="results file, the plot beside it (.png); default results/learning.json (results/quick/ with --quick) "
        "for the tiny model's sim run, required otherwise (a pretrained or MiniWoB++ run, --combine)",
    )
    parser.add_argument(
        "--shared-cores",
        action="store_true",
        help="let every role share all CPUs (default: the learner gets a core of its own, as on its own machine)",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="combine these result files, one or more per seed (their methods united), into --out (mean, spread, "
        "per-seed values; a plot) and stop",
    )
    args = parser.parse_args()
    if args.out is None:
        if args.combine or args.model or args.env != "sim":  # never over the tiny model's cited results
            parser.error("--out: required with --combine, --model or --env miniwob")
        args.out = results_file(__file__, quick=args.quick)
    if args.combine:
        combined = combine(args.combine, args.out, args.target)
        shown = ("target_success", "reached_target", "ratio_ci95", "ratio_lower_bound", "ratio_per_seed", "auc")
        summary = {k: combined[k] for k in ("ratio", "ratio_reason")} | {k: combined["metrics"][k] for k in shown}
        print(json.dumps(summary, indent=2))
        return
    if args.model and args.target is not None:
        parser.error("--target: a pretrained run's target is one every method reaches (set per run)")
    if args.latency_spread < 1 or args.latency_sigma < 0:
        parser.error("--latency-spread: at least 1 (slowest ÷ fastest); --latency-sigma: at least 0")
    recipe_flags = {"noise": args.noise, "scripted_episodes": args.scripted_episodes, "bc_updates": args.bc_updates}
    given = [name for name, value in recipe_flags.items() if value is not None]
    if given and (args.model or args.warm_start):
        why = "--model has no warm start" if args.model else "the saved warm start's recipe sets it"
        parser.error(f"--{given[0].replace('_', '-')}: {why}")
    for name, value in recipe_flags.items():
        setattr(args, name, WARM_RECIPE[name] if value is None else value)
    if args.model and (args.warm_start or args.save_warm_start):
        flag = "--warm-start" if args.warm_start else "--save-warm-start"
        parser.error(f"{flag}: --model has no warm start (every method starts from the zero-shot policy)")
    budget = args.budget or (90.0 if args.quick else 300.0)
    eval_tasks = args.eval_tasks or (40 if args.quick else 80)
    envs = args.envs or (4 if args.model else 16)  # SmolLM2 serves ~2 actions/s: 16 envs would mostly wait
    # What every evaluation runs (the held-out tasks, one episode each), as the reports of a fine-tuned model say.
    plan = EvalPlan(split="test", tasks=eval_tasks, concurrency=MINIWOB_BROWSERS if args.env == "miniwob" else 16)
    default_learner = PRETRAINED_LEARNER if args.model else LEARNER
    learner_profile = with_learner_changes(default_learner, args.learner)
    for name, settings in args.variant:
        if name in METHODS:  # a method's name is its run's name: two methods must never share one
            parser.error(f"--variant {name}: that name is already a method")
        algorithm = settings.pop("algorithm", "aride")
        METHODS[name] = {"algorithm": algorithm, "mode": "async", "learner": settings}
    methods = [m for m in args.methods.split(",") if m] + [name for name, _settings in args.variant]
    if unknown := [m for m in methods if m not in METHODS]:
        parser.error(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(METHODS)})")
    if not methods:
        parser.error("--methods: no method to run")
    if args.env == "miniwob" and not args.model:
        parser.error("--env miniwob: needs --model (the tiny model's warm start is scripted on the simulator)")
    if args.env == "miniwob" and args.templates is not None:
        parser.error("--templates: sim templates, not for --env miniwob (its tasks are env.miniwob_tasks)")
    templates = [t for t in (args.templates or ",".join(TEMPLATES)).split(",") if t]
    saved_recipe = read_warm_start(args.warm_start, templates) if args.warm_start else {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    learner_cores, serving_cores = split_cores(shared=args.shared_cores)
    if serving_cores is not None:
        # Inherited by everything the bench starts (broker, vLLM server, collectors); the learner is moved off it.
        os.sched_setaffinity(0, serving_cores)

    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        root = Path(tmp)
        with local_services(root, args.inference_url, args.model, args.precision) as services:
            model_dir, bootstrap, server_url = services.model_dir, services.bootstrap, services.url
            prefix = f"bench-learning-{uuid.uuid4().hex[:6]}"
            base: dict[str, Any] = {
                "run": prefix,
                "data_dir": str(root / "data"),
                "kafka": {"bootstrap_servers": bootstrap},
                "model": {"base": str(model_dir)},
                "inference": {
                    "url": server_url,
                    "request_timeout_s": 60.0,
                    **(PRETRAINED_UP_PROFILE["inference"] if args.model else {}),
                },
                "env": (
                    {"kind": "miniwob"}
                    if args.env == "miniwob"
                    else {
                        "templates": templates,
                        "latency": "lognormal",
                        "latency_mean_s": args.latency_mean,
                        "latency_sigma": args.latency_sigma,
                        "latency_task_spread": args.latency_spread,
                    }
                ),
                "learner": {**learner_profile, "dtype": args.precision},
                # One host: the warm start is a local adapter folder, and versions stay in the same (file://) store,
                # every one of them: each is evaluated after training, so none may be pruned.
                "artifacts": {"store": "file", "keep_versions": 1_000_000},
            }
            # Evaluation's settings: the same run and envs without the sim's step latency (see the module docstring).
            cfg = load_config(None, **{**base, "env": {**base["env"], "latency": "none"}})
            tasks = plan.task_list(cfg)
            if args.env == "miniwob":
                templates = cfg.env.miniwob_tasks  # what the results call the tasks evaluated

            recipe: dict[str, Any] = {}
            warm: EvalResult | None = None
            warm_source = None
            if not args.model:  # a pretrained model (the paper's setting) fine-tunes its zero-shot policy itself
                base_weights = sha256_file(model_dir / "model.safetensors")
                if args.warm_start is not None:
                    warm_start = load_warm_start(base, args.warm_start, saved_recipe, base_weights)
                else:
                    warm_start = clone_warm_start(
                        # The recipe's clone: --learner changes the methods' learners, not the warm start.
                        {**base, "learner": {**default_learner, "dtype": args.precision}},
                        episodes=args.scripted_episodes,
                        noise=args.noise,
                        bc_updates=args.bc_updates,
                        base_weights=base_weights,
                    )
                warm_source = str(args.warm_start or "cloned in this run")
                if args.save_warm_start is not None:
                    save_warm_start(warm_start, args.save_warm_start)
                recipe = warm_start.recipe
                base["learner"]["init_adapter"] = str(warm_start.adapter)
                warm = evaluate_warm_start(cfg, prefix, server_url, tasks, root)
                log.info(
                    "scripted (noise %.2f) %.2f, warm start %.2f",
                    recipe["scripted_noise"],
                    recipe["scripted_policy_success"],
                    warm.success_rate,
                )

            # The seed moves what the methods do from here on; the warm start and the held-out tasks above stay.
            base["learner"]["seed"] = args.seed
            base["env"]["seed"] = args.seed
            runs = {m: train(m, base, root, server_url, budget, envs, learner_cores) for m in methods}
            evaluation_cores = serve_evaluations_on_every_core(services, learner_cores, serving_cores)
            # Version 0 (the base model, served again once the methods' adapters are unloaded) is evaluated as every
            # version is, on the evaluation server: on MiniWoB++ an episode's time limit makes outcomes depend on speed.
            (untrained,) = asyncio.run(evaluate_versions(cfg, server_url, [0], tasks, concurrency=plan.concurrency))
            log.info("untrained (zero-shot) %.2f", untrained.success_rate)
            evaluated = {
                m: asyncio.run(
                    evaluate_curve(
                        cfg,
                        server_url,
                        root / f"staging-{m}",
                        r,
                        pick_versions(r, budget, args.points),
                        tasks,
                        concurrency=plan.concurrency,
                    )
                )
                for m, r in runs.items()
            }
            curves = {m: curve for m, (curve, _) in evaluated.items()}
    trained = curves  # each method's own versions (best and final are over these)
    if args.model:
        # The paper's setting: every number of a fine-tuned model comes with its evaluation's report.
        results = {m: rs for m, (_, rs) in evaluated.items()}
        for path in write_eval_reports(cfg, args.out, untrained, results, plan, server_url):
            log.info("evaluation report %s (and .md)", path)
        curves = {m: with_zero_shot(c, untrained) for m, c in curves.items()}
        target = reachable_target(trained, untrained.success_rate)
        target_note = f"zero-shot + {TARGET_GAP_SHARE} × (lowest best − zero-shot)"
    else:
        target = TARGET_SUCCESS if args.target is None else args.target
        target_note = "fixed (--target)"
    times = {m: None if target is None else time_to(c, target) for m, c in curves.items()}
    ratio, ratio_reason = sync_speedup(times, target)
    latency = None
    if args.env == "sim":
        latency = {
            "model": "lognormal",
            "mean_s": args.latency_mean,
            "sigma": args.latency_sigma,
            "task_spread": args.latency_spread,
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    where = f"{len(templates)} MiniWoB++ tasks" if args.env == "miniwob" else f"{len(templates)} sim templates"
    plot(curves, untrained.success_rate, target, budget, where, args.out.with_suffix(".png"))
    result: dict[str, Any] = {
        "name": "learning",
        "quick": args.quick,
        "ratio": ratio,
        "target": TARGET_RATIO,
        "metrics": {
            "time_to_target_s": times,
            "target_success": target,
            "target_note": target_note,
            "reached_target": {m: t is not None for m, t in times.items()},
            "ratio_note": "sync time-to-target / async time-to-target, only when both ran and both reached it",
            "ratio_reason": ratio_reason,
            "final_success": {m: c[-1]["success"] if c else None for m, c in trained.items()},
            "best_success": {m: max((p["success"] for p in c), default=None) for m, c in trained.items()},
            "auc": {m: area_under(c, budget) for m, c in curves.items()},
            "method_settings": {m: METHODS[m] for m in curves},
            "learner_stats": {m: r.learner_stats for m, r in runs.items()},
            "untrained_success": untrained.success_rate,
            "untrained_by_template": untrained.by_template,
            "warm_start_success": None if warm is None else warm.success_rate,
            "warm_start_weights_sha256": recipe.get("warm_start_weights_sha256"),
            "warm_start_source": warm_source,
            "base_weights_sha256": recipe.get("base_weights_sha256"),
            "warm_start_by_template": None if warm is None else warm.by_template,
            "scripted_policy_success": recipe.get("scripted_policy_success"),
            "curves": curves,
            "versions_published": {m: len(r.published_within(budget)) for m, r in runs.items()},
            "trajectories": {m: r.trajectories for m, r in runs.items()},
            "collected_successes": {m: r.collected_successes for m, r in runs.items()},
            "learner_updates": {m: r.learner_updates for m, r in runs.items()},
            "budget_s_per_method": budget,
            "seed": args.seed,
            "envs": envs,
            "env": args.env,
            "templates": templates,
            "latency": None if latency is None else latency | {"note": describe_latency(latency)},
            "eval_tasks": eval_tasks,
            "learner": learner_profile,
            "precision": args.precision,
            # What the setting became on this machine's CPU, where the bench runs every role: `auto` is bf16 on one
            # with bf16 units, float32 elsewhere, and seeds compare only in one precision.
            "precision_resolved": resolve_precision(args.precision, "cpu", role="bench"),
            "scripted_noise": recipe.get("scripted_noise"),
            "scripted_episodes": recipe.get("scripted_episodes"),
            "bc_updates": recipe.get("bc_updates"),
            "model": args.model or "tiny (0.33M parameters, LoRA rank 8 on all projections)",
            "inference": PRETRAINED_UP_PROFILE["inference"] if args.model else {},
            "wall_s": time.monotonic() - started,
            "load_average_1min": os.getloadavg()[0],
            "cores": {
                "learner": sorted(learner_cores) if learner_cores else "shared",
                "inference_and_collector": sorted(serving_cores) if serving_cores else "shared",
                "evaluation": evaluation_cores or "as training",
            },
        },
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"} | {"time_to_target_s": times}, indent=2))


if __name__ == "__main__":
    main()
