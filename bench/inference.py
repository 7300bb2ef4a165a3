"""Policy inference for 32 concurrent collectors: the vLLM server (batched) vs per-request transformers ``generate``.

Headline (issue 5): ``ratio`` = vLLM actions/s ÷ transformers actions/s on the same model, same workload, same run;
target ≥ 5. The workload is what collectors send: choice-mode requests (a prompt from a simulated-phone screen and
its candidate actions), 32 collectors in a closed loop (each sends its next request when the previous one is
answered). The baseline serves the same 32 collectors from one in-process model, one ``generate`` call per
request (a model cannot run two generate calls at once on these cores), with the same choice constraint (xgrammar's
logits processor, the grammar vLLM compiles) and the same sampling (temperature 1, no top-p/top-k).

Metrics: both rates, p50/p95 latency per request (queueing included: what a collector waits), the mean |gap|
between the server's log-probs and the learner-side recomputation (fp32 transformers) of the vLLM samples, and the
same rates per CPU second (``cpu_ratio``; vLLM's count includes its server processes, idle polling too), which other
processes on the shared cores cannot distort the way they distort wall-clock rates.

The phases run one after the other (vLLM, then transformers with the server stopped), so neither competes with the
other for the 2 cores.

The headline model is the local ``small`` one (10M parameters); the full run also measures ``tiny`` (0.33M), whose
requests are all per-call overhead on both sides, as ``tiny_*`` metrics.

Usage: ``python bench/inference.py [--quick] [--size tiny|small] [--model DIR]`` writes
``bench/results/inference.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xgrammar as xgr
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.cli.bench import write_results
from distrl_stream.config import InferenceConfig, ModelConfig
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.inference.server import InferenceServer, cuda_available
from distrl_stream.policy.logprobs import choice_grammar
from distrl_stream.policy.model import build_model, count_parameters
from distrl_stream.policy.prompt import build_prompt
from distrl_stream.testing.parity import logprob_gaps

TARGET_RATIO = 5.0
CONCURRENCY = 32

Case = tuple[str, list[str]]


async def workload(n: int) -> list[Case]:
    """``n`` (prompt, candidates) pairs from simulated-phone episodes: each task's screens along its oracle path."""
    cases: list[Case] = []
    env = SimEnv()
    for task in sim_tasks("train", n):
        obs = await env.reset(task)
        previous: list[str] = []
        while len(cases) < n:
            candidates = env.candidates(obs)
            cases.append((build_prompt(obs.instruction, obs.screen, previous), candidates))
            action = env.oracle_action()
            if action is None:
                break
            result = await env.step(action)
            previous.append(action.to_text())
            if result.done or result.truncated:
                break
        if len(cases) >= n:
            break
    return cases


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by linear interpolation."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Phase:
    """One side's measurement: answers in request order, per-request latencies, wall time of the whole run, and the
    CPU seconds spent on it (this process, plus the server's processes for vLLM)."""

    results: list[Any]
    latencies: list[float]
    wall_s: float
    cpu_s: float = 0.0

    def rate(self) -> float:
        return len(self.results) / self.wall_s

    def cpu_rate(self) -> float:
        return len(self.results) / self.cpu_s


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in process group ``pgid``, from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        # After the command name: state, ppid, pgrp, ..., utime (14th field overall), stime (15th).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def closed_loop(cases: list[Case], concurrency: int, call: Callable[[Case], Awaitable[Any]]) -> Phase:
    """Run ``cases`` through ``concurrency`` collectors, each awaiting ``call(case)`` back to back."""
    queue = list(enumerate(cases))
    results: list[Any] = [None] * len(cases)
    latencies: list[float] = []

    async def collector() -> None:
        while queue:
            index, case = queue.pop(0)
            started = time.perf_counter()
            results[index] = await call(case)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(collector() for _ in range(concurrency)))
    return Phase(results, latencies, time.perf_counter() - started)


async def bench_vllm(model_dir: Path, cases: list[Case], warmup: list[Case], log: Path) -> tuple[Phase, float, str]:
    """The vLLM phase: start the server (timed apart), warm it up, run the collectors, stop it."""
    inference = InferenceConfig(port=0, request_timeout_s=120.0, max_connections=CONCURRENCY)
    server = InferenceServer(model_dir, inference, ModelConfig(), log)
    started = time.perf_counter()
    server.start()
    startup_s = time.perf_counter() - started
    try:
        cfg = inference.model_copy(update={"port": server.port})
        async with InferenceClient(cfg) as client:
            await asyncio.gather(*(client.act(p, c) for p, c in warmup))
            cpu_before = group_cpu_s(server.pid or 0) + time.process_time()
            phase = await closed_loop(cases, CONCURRENCY, lambda case: client.act(*case))
            phase.cpu_s = group_cpu_s(server.pid or 0) + time.process_time() - cpu_before
    finally:
        server.stop()
    return phase, startup_s, server.device


async def bench_transformers(model_dir: Path, cases: list[Case], warmup: list[Case]) -> Phase:
    """The baseline: one in-process model, one constrained ``generate`` per request, collectors queue for it."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size))

    def generate(case: Case) -> str:
        prompt, candidates = case
        processor = xgr.contrib.hf.LogitsProcessor(compiler.compile_grammar(choice_grammar(candidates)))
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **inputs,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max(len(c.encode()) for c in candidates) + 1,
                logits_processor=[processor],
                pad_token_id=tokenizer.eos_token_id,
            )
        return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    # One model, one generate at a time: a second concurrent call would only split the same cores.
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as executor:
        for case in warmup:
            await loop.run_in_executor(executor, generate, case)
        cpu_before = time.process_time()
        phase = await closed_loop(cases, CONCURRENCY, lambda case: loop.run_in_executor(executor, generate, case))
        phase.cpu_s = time.process_time() - cpu_before
        return phase


def server_learner_gaps(model_dir: Path, cases: list[Case], results: list[ActionResult]) -> list[float]:
    """|server log μ(a|s) − learner log π(a|s)| per vLLM sample, same weights (bf16 server vs fp32 here)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return logprob_gaps(model, tokenizer, [p for p, _ in cases], results, [c for _, c in cases])


async def measure(model_dir: Path, n_vllm: int, n_hf: int, log: Path) -> dict[str, Any]:
    """Both phases on one model; the metrics of the result file."""
    cases = await workload(n_vllm + 16)
    warmup, cases = cases[:16], cases[16:]
    params = count_parameters(model_dir)
    print(f"{model_dir.name}: {params:,} params; {n_vllm} vLLM and {n_hf} transformers requests", file=sys.stderr)
    vllm, startup_s, device = await bench_vllm(model_dir, cases, warmup, log)
    hf = await bench_transformers(model_dir, cases[:n_hf], warmup[:4])
    gaps = server_learner_gaps(model_dir, cases, vllm.results)
    return {
        "ratio": vllm.rate() / hf.rate(),
        # Per CPU second: what load from other processes on the shared cores cannot distort.
        "cpu_ratio": vllm.cpu_rate() / hf.cpu_rate(),
        "vllm_actions_per_cpu_s": vllm.cpu_rate(),
        "transformers_actions_per_cpu_s": hf.cpu_rate(),
        "vllm_actions_per_s": vllm.rate(),
        "transformers_actions_per_s": hf.rate(),
        "vllm_latency_p50_s": percentile(vllm.latencies, 0.5),
        "vllm_latency_p95_s": percentile(vllm.latencies, 0.95),
        "transformers_latency_p50_s": percentile(hf.latencies, 0.5),
        "transformers_latency_p95_s": percentile(hf.latencies, 0.95),
        "mean_abs_logprob_gap_nats": statistics.fmean(gaps),
        "max_abs_logprob_gap_nats": max(gaps),
        "vllm_requests": n_vllm,
        "transformers_requests": n_hf,
        "vllm_valid_fraction": sum(r.text in c for r, (_, c) in zip(vllm.results, cases, strict=True)) / n_vllm,
        "transformers_valid_fraction": sum(t in c for t, (_, c) in zip(hf.results, cases, strict=False)) / n_hf,
        "model_params": params,
        "vllm_device": device,
        "vllm_startup_s": startup_s,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, headline model only (about 1.5 min)")
    parser.add_argument("--size", choices=["tiny", "small"], default="small", help="headline local model")
    parser.add_argument("--model", type=Path, help="serve this model folder instead of building one")
    args = parser.parse_args()
    n_vllm, n_hf = (160, 64) if args.quick else (640, 192)
    # One thread: on 2 shared cores a second torch thread stalls on every busy neighbour (docs/design.md §8), and these
    # models gain little from it.
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="bench-inference-") as tmp:
        model_dir = args.model or build_model(Path(tmp) / args.size, args.size)
        metrics = await measure(model_dir, n_vllm, n_hf, Path(tmp) / "vllm.log")
        ratio = metrics.pop("ratio")
        metrics |= {"model": str(args.model) if args.model else args.size, "mode": "choice"}
        metrics |= {"concurrency": CONCURRENCY, "torch_threads": 1, "cuda": cuda_available()}
        if not args.quick and args.model is None:
            # The tiny model is all per-request overhead on both sides; its ratio shows the floor of batching's gain.
            other = "tiny" if args.size == "small" else "small"
            extra = await measure(build_model(Path(tmp) / other, other), n_vllm // 2, n_hf // 2, Path(tmp) / "v2.log")
            metrics |= {f"{other}_{key}": value for key, value in extra.items()}

    result = {"name": "inference", "quick": args.quick, "ratio": ratio, "target": TARGET_RATIO, "metrics": metrics}
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
