"""bf16 end to end against float32, and the prompt's token ids on the log: SmolLM2-135M-Instruct on this machine.

Four measurements, side by side in one run (``--part`` runs one):

- **learner** (``bench/pretrained.py``'s learner child, one fresh process per arm, so each peak RSS is its own): A-RIDE
  updates on episodes of the simulated phone (chat prompts, SmolLM2's token ids, the prompts' ids as the server gives
  them) at the pretrained profile's batch, one torch thread. Arms: **today** (float32, the profile as it was: 2-step
  micro-batches with checkpointed layers, every prompt computed whole), **unpacked** (``learner.dtype = auto``, bf16
  here, with the profile of ``PRETRAINED_UP_PROFILE`` now, ``learner.shared_prefix`` off) and **default** (the same
  with the shared prompt prefix computed once per pass, the default), every arm at the profile's priority refresh
  interval (the spread re-scoring is part of an A-RIDE update). Each child also runs a **bare** forward +
  backward of the same micro-batches in its own precision and layout. ``ratio`` = default update tokens/s ÷ today's
  (target ≥ 3.0); ``efficiency_vs_bare`` = default update tokens/s ÷ a bare bf16 forward + backward of the same tokens
  without checkpointing (target ≥ 0.9); ``peak_rss_gb`` of the default arm (target ≤ 3 GB); ``shared_prefix``: the
  default arm's update tokens/s ÷ the unpacked arm's (``ratio``; CPU seconds too, ``cpu_ratio``, which shared cores
  disturb less) and ``shared_prefix_share``, the share of the update's prompt + action tokens the packed passes did not
  compute. Each arm records the ``precision`` it resolved: on a CPU without bf16 units (AVX2 only) ``auto`` is
  float32, and the run compares layouts, not precisions. An arm that fails (a setting past the child's memory
  limit) keeps its ``error`` and leaves the figures that need it null.
- **serving**: one vLLM server on SmolLM2 per precision, one after the other, the same chat prompts with candidates
  (held-out sim states of a random policy), 8 requests in flight: actions/s bf16 ÷ float32 (target ≥ 2.0).
- **mismatch**: |log π_learner − log μ_server| per action on those answers, the base model on both sides: bf16
  learner against the bf16 server (what ``auto`` runs), float32 against float32, and float32 learner against the bf16
  server (the mix ``up`` ran before).
- **wire**: bytes per step of a TrajectoryEvent with and without ``prompt_token_ids``, Avro alone and lz4-compressed
  in batches of 16 events (the producer's ``compression.type``, lz4 frames as Kafka writes them).

Usage: ``python bench/precision.py [--quick] [--part learner|serving|wire|all] [--arms today,unpacked,default]
[--updates N] [--no-bare] [--prompts N]`` writes ``bench/results/precision.json`` (a part run alone keeps the other
parts' last results; ``--no-bare`` skips the bare passes, which take as long as the updates).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from learning import TEMPLATES
from pretrained import MODEL, MODEL_DIR, _scripted_events, run_learner_child
from rich.progress import Progress

from distrl_stream.cli.bench import results_file, write_results
from distrl_stream.orchestrate import PRETRAINED_UP_PROFILE

TARGET_RATIO = 3.0
TARGET_EFFICIENCY = 0.9
TARGET_SERVING = 2.0
TARGET_RSS_GB = 3.0
# The pretrained profile's learner before bf16 (the float32 path every learning result so far ran).
TODAY = {
    "batch_episodes": 2,
    "min_buffer_episodes": 4,
    "micro_batch_steps": 2,
    "gradient_checkpointing": True,
    "threads": 1,
    "dtype": "float32",
    "shared_prefix": False,
    "priority_refresh_interval": PRETRAINED_UP_PROFILE["learner"]["priority_refresh_interval"],
}
LEARNER_ARMS = ("today", "unpacked", "default")
# priority_refresh_interval too: at LearnerConfig's 20 every update of a 32-episode buffer re-scores 1.6 episodes (a
# no-grad pass over their steps, 13 s of a 49 s bf16 update), at the profile's 200 one every six updates.
LEARNER_KEYS = (
    "batch_episodes",
    "min_buffer_episodes",
    "micro_batch_steps",
    "gradient_checkpointing",
    "threads",
    "priority_refresh_interval",
)

log = logging.getLogger("bench.precision")


def learner(updates: int, names: list[str], *, bare_passes: bool) -> dict[str, Any]:
    """Today's float32 path, the bf16 profile with every prompt whole, and the default (bf16, the shared prompt prefix
    computed once), each in its own child process."""
    profile = PRETRAINED_UP_PROFILE["learner"]
    default = {**{k: profile[k] for k in LEARNER_KEYS if k in profile}, "dtype": "auto"}
    arms = {"today": TODAY, "unpacked": {**default, "shared_prefix": False}, "default": default}
    return {name: run_learner_child(name, arms[name], updates, bare_passes=bare_passes) for name in names}


def measured(arm: dict[str, Any] | None) -> dict[str, Any] | None:
    """An arm's results, or None where it was not run or failed (its error stays under ``metrics.learner``)."""
    return arm if arm and not arm.get("error") else None


def shared_prefix_metrics(unpacked: dict[str, Any] | None, default: dict[str, Any] | None) -> dict[str, Any] | None:
    """The packed passes against the unpacked ones on the same batches (None without both arms)."""
    if not unpacked or not default:
        return None
    return {
        "ratio": default["update_tokens_per_s"] / unpacked["update_tokens_per_s"],
        "cpu_ratio": unpacked["update_cpu_s"] / default["update_cpu_s"],
        "shared_prefix_share": 1 - default["tokens_computed_per_update"] / default["tokens_per_update"],
        "packed_update_tokens_per_s": default["update_tokens_per_s"],
        "unpacked_update_tokens_per_s": unpacked["update_tokens_per_s"],
        "tokens_computed_per_update": {
            "packed": default["tokens_computed_per_update"],
            "unpacked": unpacked["tokens_computed_per_update"],
        },
        "update_s": {"packed": default["update_s"], "unpacked": unpacked["update_s"]},
        "note": "default (the shared prompt prefix computed once per pass) ÷ unpacked (every prompt whole, padded), "
        "both bf16 at the pretrained profile; tokens/s count each step's prompt + action tokens once in both arms",
    }


def serving_and_mismatch(n_prompts: int, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Actions/s of the server in each precision on the same prompts, and the learner's log π against its log μ."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distrl_stream.config import InferenceConfig, ModelConfig
    from distrl_stream.inference.server import InferenceServer
    from distrl_stream.testing.parity import logprob_gaps

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    states = _states(tokenizer, n_prompts)
    prompts, candidates = [p for p, _ in states], [c for _, c in states]
    answers: dict[str, list[Any]] = {}
    serving: dict[str, Any] = {"prompts": len(states), "concurrency": 8}
    for precision in ("bfloat16", "float32"):
        inference = InferenceConfig(
            port=0,
            startup_timeout_s=300.0,
            request_timeout_s=120.0,
            **{**PRETRAINED_UP_PROFILE.get("inference", {}), "dtype": precision},
        )
        server = InferenceServer(MODEL_DIR, inference, ModelConfig(), root / f"vllm-{precision}.log")
        server.start()
        try:
            cfg = inference.model_copy(update={"port": server.port})
            answers[precision], seconds = asyncio.run(_act(cfg, states))
        finally:
            server.stop()
        serving[precision] = {"actions_per_s": len(states) / seconds, "seconds": seconds}
        log.info("vLLM %s: %.2f actions/s", precision, len(states) / seconds)
    serving["ratio"] = serving["bfloat16"]["actions_per_s"] / serving["float32"]["actions_per_s"]

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    mismatch: dict[str, Any] = {"actions": len(states), "note": "|log π_learner − log μ_server| per action, nats"}
    for learner_precision, server_precision in (
        ("bfloat16", "bfloat16"),
        ("float32", "float32"),
        ("float32", "bfloat16"),
    ):
        gaps = logprob_gaps(
            model, tokenizer, prompts, answers[server_precision], candidates, batch_size=8, precision=learner_precision
        )
        name = f"learner_{learner_precision}_server_{server_precision}"
        mismatch[name] = {"mean": statistics.fmean(gaps), "max": max(gaps), "p95": _quantile(gaps, 0.95)}
        log.info("%s: mean %.4f max %.4f", name, mismatch[name]["mean"], mismatch[name]["max"])
    return serving, mismatch


async def _act(inference: Any, states: list[tuple[str, list[str]]]) -> tuple[list[Any], float]:
    from distrl_stream.inference.client import InferenceClient

    limit = asyncio.Semaphore(8)
    async with InferenceClient(inference, "policy") as client:
        await client.refresh_versions()
        await client.act(states[0][0], states[0][1], mode="choice")  # warm-up: the first request compiles

        async def one(prompt: str, options: list[str]) -> Any:
            async with limit:
                return await client.act(prompt, options, mode="choice")

        started = time.perf_counter()
        results = await asyncio.gather(*(one(p, c) for p, c in states))
        return results, time.perf_counter() - started


def _states(tokenizer: Any, n: int) -> list[tuple[str, list[str]]]:
    """(chat prompt, candidates) of the held-out sim states a random policy visits."""
    from distrl_stream.collector import run_episode
    from distrl_stream.envs.sim import SimEnv, sim_tasks
    from distrl_stream.policy.prompt import Prompter
    from distrl_stream.testing.scripted import ScriptedPolicy

    states: list[tuple[str, list[str]]] = []

    class Keep(ScriptedPolicy):
        async def act(self, prompt: Any, candidates: Any = None, *, mode: str = "choice") -> Any:
            states.append((prompt, list(candidates or ())))
            return await super().act(prompt, candidates, mode=mode)

    rng = random.Random(0)
    tasks = sim_tasks("test", 200, TEMPLATES)
    env = SimEnv()
    while len(states) < n:
        policy = Keep(env, tokenizer, noise=1.0, rng=rng)
        asyncio.run(run_episode(env, rng.choice(tasks), policy, "choice", episode_id="e", prompter=Prompter(tokenizer)))
    return states[:n]


def wire(n_episodes: int) -> dict[str, Any]:
    """Bytes per step with and without the prompt's ids: Avro, and lz4 over batches of 16 events."""
    import lz4.frame
    from transformers import AutoTokenizer

    from distrl_stream.events import encode

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    events = _scripted_events(tokenizer, n_episodes, seed=1)
    steps = sum(len(e.steps) for e in events)
    without = [
        dataclasses.replace(e, steps=[dataclasses.replace(s, prompt_token_ids=None) for s in e.steps]) for e in events
    ]
    out: dict[str, Any] = {"episodes": len(events), "steps": steps, "batch_events": 16}
    for name, batch in (("before", without), ("after", events)):
        blobs = [encode(e) for e in batch]
        compressed = sum(len(lz4.frame.compress(b"".join(blobs[i : i + 16]))) for i in range(0, len(blobs), 16))
        out[name] = {"avro_bytes_per_step": sum(map(len, blobs)) / steps, "lz4_bytes_per_step": compressed / steps}
    ids = [len(s.prompt_token_ids.to_numpy()) for e in events for s in e.steps if s.prompt_token_ids is not None]
    out["prompt_tokens_per_step"] = statistics.fmean(ids)
    out["prompt_ids_dtype"] = events[0].steps[0].prompt_token_ids.dtype if events[0].steps[0].prompt_token_ids else None
    out["shared_prefix_share"] = _shared_prefix_share(events)
    return out


def _shared_prefix_share(events: list[Any]) -> float:
    """The share of prompt tokens an episode's later steps have in common with its first step's prompt (the system
    message and the task): what computing the shared prefix once per episode would save."""
    shared = total = 0
    for event in events:
        first = event.steps[0].prompt_token_ids.to_numpy().tolist()
        for step in event.steps:
            ids = step.prompt_token_ids.to_numpy().tolist()
            common = next(
                (i for i, (a, b) in enumerate(zip(first, ids, strict=False)) if a != b), min(len(first), len(ids))
            )
            total += len(ids)
            shared += common if step is not event.steps[0] else 0
    return shared / max(total, 1)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.floor(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 updates per arm, 24 prompts, 8 episodes")
    parser.add_argument("--part", choices=["learner", "serving", "wire", "all"], default="all")
    parser.add_argument("--updates", type=int, help="timed A-RIDE updates per learner arm (default 5)")
    parser.add_argument(
        "--arms",
        default=",".join(LEARNER_ARMS),
        help=f"learner arms, comma-separated (default {','.join(LEARNER_ARMS)})",
    )
    parser.add_argument("--no-bare", action="store_true", help="skip the learner arms' bare passes")
    parser.add_argument("--prompts", type=int, help="prompts served per precision (default 96)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if not set(arms) <= set(LEARNER_ARMS):
        parser.error(f"--arms: choose among {', '.join(LEARNER_ARMS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    updates = args.updates or (2 if args.quick else 5)
    n_prompts = args.prompts or (24 if args.quick else 96)

    from distrl_stream.policy.pretrained import provenance, pull

    pull(MODEL, MODEL_DIR)
    results = results_file(__file__, quick=args.quick)
    previous = json.loads(results.read_text()) if results.is_file() else {}
    metrics: dict[str, Any] = dict(previous.get("metrics", {}))
    metrics["model"] = provenance(MODEL_DIR)
    parts = ["learner", "serving", "wire"] if args.part == "all" else [args.part]
    with Progress() as progress:
        task = progress.add_task("precision", total=len(parts))
        for part in parts:
            progress.update(task, description=part)
            if part == "learner":
                metrics["learner"] = learner(updates, arms, bare_passes=not args.no_bare)
            elif part == "serving":
                with tempfile.TemporaryDirectory(prefix="bench-precision-") as tmp:
                    metrics["serving"], metrics["mismatch"] = serving_and_mismatch(n_prompts, Path(tmp))
            else:
                metrics["wire"] = wire(8 if args.quick else 32)
            progress.advance(task)
    results_of = metrics.get("learner", {})
    today, default = measured(results_of.get("today")), measured(results_of.get("default"))
    ratio = default["update_tokens_per_s"] / today["update_tokens_per_s"] if today and default else None
    wire_bytes = metrics.get("wire", {})
    result = {
        "name": "precision",
        "quick": args.quick,
        "ratio": ratio,
        "target": TARGET_RATIO,
        "metrics": {
            **metrics,
            "ratio_note": f"A-RIDE update tokens/s, learner.dtype auto ({default['precision'] if default else '?'} "
            "on this CPU) with the shared prompt prefix computed once, at the pretrained profile ÷ the float32 path "
            "of before (2-step micro-batches, checkpointed layers, every prompt whole), one torch thread",
            # ÷ a bare bf16 forward + backward of the same micro-batches with nothing recomputed (no checkpointing).
            "efficiency_vs_bare": default["update_tokens_per_s"]
            / default.get("bare_plain_tokens_per_s", default["bare_tokens_per_s"])
            if default and "bare_tokens_per_s" in default
            else None,
            "efficiency_vs_bare_checkpointed": default.get("ratio") if default else None,
            "shared_prefix": shared_prefix_metrics(measured(results_of.get("unpacked")), default),
            "efficiency_target": TARGET_EFFICIENCY,
            "serving_ratio": metrics.get("serving", {}).get("ratio"),
            "serving_target": TARGET_SERVING,
            "peak_rss_gb": default["rss_peak_gb"] if default else None,
            "rss_target_gb": TARGET_RSS_GB,
            "wire_bytes_per_step": {
                k: wire_bytes[k]["lz4_bytes_per_step"] for k in ("before", "after") if k in wire_bytes
            },
        },
    }
    write_results(__file__, result, quick=args.quick)
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}))


if __name__ == "__main__":
    main()
