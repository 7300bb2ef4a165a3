"""A real pretrained policy: SmolLM2-135M-Instruct's zero-shot success per prompt format, and the learner's efficiency.

Two parts, each its own measurement (``--part``):

- **zero-shot** (``vllm``): one vLLM server on SmolLM2 (``distrl-stream model pull smollm2-135m-instruct``, served as
  ``up``'s pretrained profile serves it: ``max_model_len`` 2048). Held-out (test-split) success of the untrained model
  (version 0) with the **chat** prompt (the tokenizer's chat template, candidates listed), with the **raw** prompt of
  the tiny models, and of a **uniformly random** candidate (``ScriptedPolicy`` without an oracle), on the same tasks:
  the eight sim templates of ``bench/learning.py`` and the default MiniWoB++ subset (real headless chromium). Choice
  mode, temperature 1 (the behaviour policy's sampling): one episode per task.
- **learner**: A-RIDE updates on SmolLM2 in a fresh child process per setting (peak RSS is the child's own), on
  episodes of the simulated phone played by a noisy scripted policy (half oracle, half random; chat prompts, SmolLM2's
  token ids), at the pretrained profile's batch (``PRETRAINED_UP_PROFILE``) and one torch thread. Beside each setting,
  in the same child, on the very micro-batches the update ran with gradient, laid out as the update laid them out
  (packed around their shared prompt prefix when ``learner.shared_prefix`` packs them): a **bare** forward + backward
  of the same model (decoder, LoRA trainable, a sum of the action positions' hidden states as the loss) — what this
  machine does at best with those tokens. Each child also reports the tokens its passes computed (a packed
  sequence's, or an unpacked micro-batch's padded rows) and the process's CPU seconds an update. ``ratio`` = A-RIDE
  update tokens/s ÷ bare tokens/s (target ≥ 0.7); peak RSS of the child during updates at the profile's batch
  (target ≤ 3 GB). Settings: the profile (micro-batches of
  ``micro_batch_steps``), the whole batch in one pass (``micro_batch_steps`` ≥ the batch: the memory a batch costs
  without micro-batching), and the profile with gradient checkpointing.

Usage: ``python bench/pretrained.py [--quick] [--part zero-shot|learner|all] [--sim-tasks N] [--miniwob-tasks N]
[--updates N]`` writes ``bench/results/pretrained.json`` (a part run alone keeps the other part's last result).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from learning import TEMPLATES, repository_model_dir

from distrl_stream.cli.bench import results_file, write_results
from distrl_stream.collector.evaluation import EvalResult, evaluate_policy, held_out_tasks
from distrl_stream.config import Config, load_config
from distrl_stream.orchestrate import PRETRAINED_UP_PROFILE
from distrl_stream.policy.prompt import Prompter

MODEL = "smollm2-135m-instruct"
MODEL_DIR = repository_model_dir(MODEL)
TARGET_RATIO = 0.7
TARGET_RSS_GB = 3.0
# Address space of one learner child (RLIMIT_AS); the model, torch and the libraries take about 4 GB of it.
CHILD_MEMORY_GB = 14

log = logging.getLogger("bench.pretrained")


# ------------------------------------------------------------------------------------------------------------------
# Zero-shot success per prompt format
# ------------------------------------------------------------------------------------------------------------------


def zero_shot(model_dir: Path, sim_tasks: int, miniwob_tasks: int, root: Path) -> dict[str, Any]:
    """Held-out success of version 0 with each prompt format, and of a random candidate, per environment."""
    from transformers import AutoTokenizer

    from distrl_stream.config import InferenceConfig, ModelConfig
    from distrl_stream.inference.client import InferenceClient
    from distrl_stream.inference.server import InferenceServer
    from distrl_stream.testing.scripted import ScriptedPolicy

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    formats = {"chat": Prompter(tokenizer), "raw": Prompter()}
    inference = InferenceConfig(
        port=0, startup_timeout_s=300.0, request_timeout_s=120.0, **PRETRAINED_UP_PROFILE["inference"]
    )
    server = InferenceServer(model_dir, inference, ModelConfig(), root / "vllm.log")
    server.start()
    out: dict[str, Any] = {}
    try:
        for env, n, concurrency in (("sim", sim_tasks, 8), ("miniwob", miniwob_tasks, 4)):
            if n <= 0:
                continue
            templates = {"templates": TEMPLATES} if env == "sim" else {}
            cfg = load_config(
                None,
                data_dir=str(root / "data"),
                model={"base": str(model_dir)},
                inference={**inference.model_dump(), "port": server.port, "version_poll_s": math.inf},
                env={"kind": env, "latency": "none", **templates},
            )
            tasks = held_out_tasks(cfg, n)
            results: dict[str, EvalResult] = {}
            for name, prompter in formats.items():
                results[name] = asyncio.run(_evaluate_v0(cfg, tasks, prompter, concurrency, InferenceClient))
                log.info("%s %s prompt: %.3f", env, name, results[name].success_rate)
            random_policy = ScriptedPolicy(None, tokenizer, 1.0, random.Random(0))
            results["random"] = asyncio.run(evaluate_policy(cfg, tasks, random_policy, concurrency=concurrency))
            log.info("%s random: %.3f", env, results["random"].success_rate)
            out[env] = {
                "tasks": len(tasks),
                **{
                    name: {
                        "success": r.success_rate,
                        "stderr": math.sqrt(r.success_rate * (1 - r.success_rate) / max(len(tasks), 1)),
                        "by_template": r.by_template,
                    }
                    for name, r in results.items()
                },
            }
    finally:
        server.stop()
    return out


async def _evaluate_v0(
    cfg: Config, tasks: list[Any], prompter: Prompter, concurrency: int, client_cls: Any
) -> EvalResult:
    async with client_cls(cfg.inference, cfg.model.policy_id) as client:
        served = await client.refresh_versions()
        assert served == 0, f"the server serves version {served}, not the base model"
        return await evaluate_policy(cfg, tasks, client, concurrency=concurrency, prompter=prompter)


# ------------------------------------------------------------------------------------------------------------------
# Learner efficiency (each setting in a child process: peak RSS is its own)
# ------------------------------------------------------------------------------------------------------------------


def learner_child(
    model_dir: Path, settings: dict[str, Any], updates: int, seed: int, *, bare_passes: bool = True
) -> dict[str, Any]:
    """A-RIDE updates at ``settings`` and (``bare_passes``) the bare forward + backward on the same micro-batches;
    one process."""
    import torch
    from transformers import AutoTokenizer

    from distrl_stream.config import LearnerConfig, ModelConfig
    from distrl_stream.learner.buffer import ReplayBuffer
    from distrl_stream.learner.records import episode_from_event
    from distrl_stream.learner.trainer import Trainer, load_policy
    from distrl_stream.policy.logprobs import (
        MIN_SHARED_PREFIX_TOKENS,
        decoder_states,
        encode_prompts,
        pack_rows,
        packed_decoder_states,
        shared_prefix_groups,
    )
    from distrl_stream.policy.precision import autocast, resolve_precision

    torch.set_num_threads(settings.get("threads", 1))
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    episodes = [episode_from_event(e) for e in _scripted_events(tokenizer, 32, seed)]
    cfg = LearnerConfig(**settings)
    precision = resolve_precision(cfg.dtype, "cpu", role="learner")
    model, policy_tokenizer = load_policy(model_dir, ModelConfig(), precision=precision)
    # Per micro-batch whose forward ran with gradient (the ones the bare pass replays): prompt ids, action ids.
    grad_batches: list[tuple[list[list[int]], list[tuple[int, ...]]]] = []

    class Recording(Trainer):
        def _step_terms(self, steps: Any) -> Any:
            if torch.is_grad_enabled():
                prompts = encode_prompts(self.tokenizer, [self.step_prompt(e, t) for e, t in steps]).input_ids
                grad_batches.append((prompts, [e.steps[t].token_ids for e, t in steps]))
            return super()._step_terms(steps)

    trainer = Recording(cfg, model, policy_tokenizer, ReplayBuffer.from_config(cfg), precision=precision)
    for episode in episodes:
        trainer.buffer.add(episode)
    loaded_rss = _max_rss_gb()
    trainer.update("aride", version=0)  # first update: the feature cache fills, allocations settle
    grad_batches.clear()
    started, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(updates):
        trainer.update("aride", version=0)
    update_s, update_cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
    update_rss = _max_rss_gb()
    tokens = sum(len(p) + len(a) for prompts, actions in grad_batches for p, a in zip(prompts, actions, strict=True))
    steps = sum(len(ps) for ps, _ in grad_batches)

    def packing(prompts: list[list[int]]) -> list[tuple[int, list[int]]] | None:
        """The groups a micro-batch's pass packed, or None when it ran unpacked."""
        groups = shared_prefix_groups(prompts, MIN_SHARED_PREFIX_TOKENS) if trainer.shared_prefix else []
        return groups if any(prefix for prefix, _ in groups) else None

    def computed(prompts: list[list[int]], actions: list[tuple[int, ...]]) -> int:
        """Tokens a micro-batch's pass computed: a packed sequence's, or the padded rows' of an unpacked one."""
        groups = packing(prompts)
        if groups is None:
            return len(prompts) * (max(map(len, prompts)) + max(max(map(len, actions)), 1))
        logical = sum(len(p) + len(a) for p, a in zip(prompts, actions, strict=True))
        return logical - sum((len(rows) - 1) * prefix for prefix, rows in groups)

    processed = sum(computed(prompts, actions) for prompts, actions in grad_batches)
    out = {
        "settings": settings,
        "precision": precision,
        "shared_prefix": trainer.shared_prefix,
        "updates": updates,
        "steps_per_update": steps / updates,
        "tokens_per_update": tokens / updates,
        "tokens_computed_per_update": processed / updates,
        "update_s": update_s / updates,
        "update_cpu_s": update_cpu_s / updates,
        "update_tokens_per_s": tokens / update_s,
        "rss_loaded_gb": loaded_rss,
        "rss_peak_gb": update_rss,
    }
    if not bare_passes:
        return {**out, "rss_peak_all_gb": _max_rss_gb()}

    # The bare pass: the same micro-batches, laid out as the learner lays them out, through the decoder and back.
    params = [p for p in model.parameters() if p.requires_grad]

    def padded_states(prompts: list[list[int]], actions: list[tuple[int, ...]]) -> torch.Tensor:
        """The unpacked pass's layout: each row prompt + action, left-padded."""
        ids = [p + list(a) for p, a in zip(prompts, actions, strict=True)]
        width = max(len(i) for i in ids)
        input_ids = torch.zeros((len(ids), width), dtype=torch.long)
        attention = torch.zeros((len(ids), width), dtype=torch.long)
        for row, row_ids in enumerate(ids):
            input_ids[row, width - len(row_ids) :] = torch.tensor(row_ids)
            attention[row, width - len(row_ids) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return decoder_states(model, input_ids, attention, positions)

    def bare() -> float:
        """Seconds of the bare forward + backward over every recorded micro-batch."""
        started = time.perf_counter()
        for prompts, actions in grad_batches:
            width_a = max(len(a) for a in actions)
            groups = packing(prompts)
            with autocast(torch.device("cpu"), precision):
                if groups is not None:
                    packed = pack_rows(prompts, actions, groups, width_a)
                    hidden = packed_decoder_states(model, packed)[packed.action_index]
                else:
                    hidden = padded_states(prompts, actions)[:, -width_a:]
            hidden.float().sum().backward()
            for p in params:
                p.grad = None
        return time.perf_counter() - started

    bare_s = bare()  # with the setting's checkpointing, if any
    plain = {}
    if cfg.gradient_checkpointing:
        # And what a forward + backward costs with nothing recomputed: the bound an update is measured against.
        model.gradient_checkpointing_disable()
        plain = {"bare_plain_tokens_per_s": tokens / bare()}
    return {
        **out,
        "bare_tokens_per_s": tokens / bare_s,
        "ratio": bare_s / update_s,
        "rss_peak_all_gb": _max_rss_gb(),
        **plain,
    }


def _scripted_events(tokenizer: Any, n: int, seed: int) -> list[Any]:
    """``n`` episodes of the eight sim templates by a half-oracle, half-random policy, with chat prompts."""
    from distrl_stream.collector import run_episode
    from distrl_stream.envs.sim import SimEnv, sim_tasks
    from distrl_stream.testing.scripted import ScriptedPolicy

    rng = random.Random(seed)
    tasks = sim_tasks("train", 200, TEMPLATES)
    prompter = Prompter(tokenizer)
    events = []
    for i in range(n):
        env = SimEnv()
        policy = ScriptedPolicy(env, tokenizer, noise=0.5, rng=rng)
        outcome = asyncio.run(
            run_episode(env, rng.choice(tasks), policy, "choice", episode_id=f"e{i}", prompter=prompter)
        )
        events.append(outcome.to_event(run="bench", collector_id="bench", mode="choice", base_model=MODEL))
    return events


def _max_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kilobytes on Linux


def learner_efficiency(model_dir: Path, updates: int) -> dict[str, Any]:
    """Each setting in its own child process, one after the other."""
    profile = PRETRAINED_UP_PROFILE["learner"]
    keys = ("batch_episodes", "min_buffer_episodes", "micro_batch_steps", "gradient_checkpointing", "threads")
    base = {k: profile[k] for k in keys if k in profile}
    settings = {
        "profile": base,
        "no_checkpointing": {**base, "gradient_checkpointing": False},
        # What an update cost before micro-batching: the whole batch in one forward with gradient.
        "one_pass": {**base, "micro_batch_steps": 10_000, "gradient_checkpointing": False},
    }
    return {name: run_learner_child(name, values, updates) for name, values in settings.items()}


def run_learner_child(name: str, settings: dict[str, Any], updates: int, *, bare_passes: bool = True) -> dict[str, Any]:
    """:func:`learner_child` at ``settings`` (LearnerConfig fields) in a fresh process of this script."""
    spec = {"settings": settings, "updates": updates, "bare_passes": bare_passes}
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not last.startswith("{"):
        raise RuntimeError(f"learner child {name} failed:\n{done.stderr[-3000:]}")
    out = json.loads(last)
    log.info("%s: %s", name, {k: out.get(k) for k in ("update_s", "ratio", "rss_peak_gb", "error")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 sim and 8 MiniWoB tasks, 2 updates per setting")
    parser.add_argument("--part", choices=["zero-shot", "learner", "all"], default="all")
    parser.add_argument("--sim-tasks", type=int, help="held-out sim tasks (default 80: 10 per template)")
    parser.add_argument("--miniwob-tasks", type=int, help="held-out MiniWoB++ tasks (default 40: 5 per task)")
    parser.add_argument("--updates", type=int, help="timed A-RIDE updates per learner setting (default 5)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        # A setting that needs more memory than CHILD_MEMORY_GB fails with torch's allocation error, reported, instead
        # of taking the machine into the kernel's OOM killer (the one-pass batch did, at 24 GB).
        limit = CHILD_MEMORY_GB * 2**30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            result = learner_child(
                MODEL_DIR, spec["settings"], spec["updates"], seed=0, bare_passes=spec.get("bare_passes", True)
            )
            print(json.dumps(result))
        except (MemoryError, RuntimeError) as exc:
            if "alloc" not in str(exc).lower() and not isinstance(exc, MemoryError):
                raise
            error = f"needs more than {CHILD_MEMORY_GB} GB of address space: {str(exc).splitlines()[0][:200]}"
            print(json.dumps({"settings": spec["settings"], "error": error}))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    sim_tasks = args.sim_tasks or (16 if args.quick else 80)
    miniwob_tasks = args.miniwob_tasks if args.miniwob_tasks is not None else (8 if args.quick else 40)
    updates = args.updates or (2 if args.quick else 5)

    from distrl_stream.policy.pretrained import provenance, pull

    model_dir = pull(MODEL, MODEL_DIR)
    results = results_file(__file__, quick=args.quick)
    previous = json.loads(results.read_text()) if results.is_file() else {}
    metrics: dict[str, Any] = dict(previous.get("metrics", {}))
    metrics["model"] = provenance(model_dir)
    if args.part in ("zero-shot", "all"):
        with tempfile.TemporaryDirectory(prefix="bench-pretrained-") as tmp:
            metrics["zero_shot"] = {
                "settings": {"mode": "choice", "temperature": 1.0, "episodes_per_task": 1},
                **zero_shot(model_dir, sim_tasks, miniwob_tasks, Path(tmp)),
            }
    if args.part in ("learner", "all"):
        metrics["learner"] = learner_efficiency(model_dir, updates)
    profile = metrics.get("learner", {}).get("profile")
    result = {
        "name": "pretrained",
        "quick": args.quick,
        "ratio": profile["ratio"] if profile else None,
        "target": TARGET_RATIO,
        "metrics": {
            **metrics,
            "ratio_note": "A-RIDE update tokens/s / bare decoder forward+backward tokens/s on the same micro-batches, "
            "at the pretrained profile's batch, one torch thread",
            "rss_target_gb": TARGET_RSS_GB,
            "rss_peak_gb": profile["rss_peak_gb"] if profile else None,
        },
    }
    write_results(__file__, result, quick=args.quick)
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}))


if __name__ == "__main__":
    main()
