"""Environment throughput: the simulated phone's steps per second, and what a real MiniWoB++ browser costs.

Headline (issue 4): ``ratio`` = simulator steps per second on one core with latency off (per CPU-second of the
process pinned to one core, median of three runs; wall-clock rates are reported beside it), the loop a collector
runs (reset, candidates, step with a candidate's text); target 5,000. Metrics add MiniWoB++ reset/step times (p50/p95)
and memory per browser (RSS and PSS of chromedriver + chromium), and how well simulated latency overlaps when many
environments run concurrently in one event loop (it is awaited, not burned).

Usage: ``python bench/envs.py [--quick]`` writes ``bench/results/envs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

from distrl_stream.cli.bench import write_results
from distrl_stream.config import load_config
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.sim import LatencyModel, SimEnv, sim_tasks
from distrl_stream.envs.tasks import miniwob_tasks

TARGET_STEPS_PER_S = 5000.0
MINIWOB_TASKS = ["click-test", "click-button", "click-link", "enter-text", "click-checkboxes", "focus-text"]


async def sim_steps_per_s(steps: int, seed: int = 0) -> tuple[float, float, int]:
    """Steps per CPU-second and per wall-second of one SimEnv driven like a collector drives it.

    The machines are shared, so wall-clock rates swing with whatever else runs on the core; CPU seconds of this
    process measure what one core delivers to the simulator.
    """
    rng = random.Random(seed)
    tasks = sim_tasks("train", 560)
    env = SimEnv()
    done_steps, episodes = 0, 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while done_steps < steps:
        obs = await env.reset(tasks[episodes % len(tasks)])
        episodes += 1
        while True:
            result = await env.step(rng.choice(env.candidates(obs)))
            done_steps += 1
            obs = result.observation
            if result.done or result.truncated:
                break
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
    return done_steps / cpu, done_steps / wall, episodes


async def latency_overlap(envs: int, steps: int, mean_s: float) -> dict[str, float]:
    """Run ``envs`` latency-modelled sims concurrently; compare wall time with the sum of their modelled waits."""
    tasks = sim_tasks("train", envs)
    model = LatencyModel(mean_s=mean_s, sigma=0.5, task_spread=100.0)

    async def run(task_index: int) -> float:
        env, rng = SimEnv(model, seed=task_index), random.Random(task_index)
        obs = await env.reset(tasks[task_index])
        waited = 0.0
        for _ in range(steps):
            result = await env.step(rng.choice(env.candidates(obs)))
            waited += result.info.extra["modeled_latency_s"]
            obs = result.observation
            if result.done or result.truncated:
                obs = await env.reset(tasks[task_index])
        return waited

    started = time.perf_counter()
    waits = await asyncio.gather(*(run(i) for i in range(envs)))
    wall = time.perf_counter() - started
    return {
        "envs": envs,
        "modelled_wait_s_total": round(sum(waits), 3),
        "slowest_env_wait_s": round(max(waits), 3),
        "wall_s": round(wall, 3),
        # 1.0 = every env's wait fully overlapped (wall = the slowest env alone).
        "overlap_efficiency": round(max(waits) / wall, 3),
        "speedup_over_serial": round(sum(waits) / wall, 1),
    }


def process_tree_memory_mb(root: int) -> tuple[float, float]:
    """RSS and PSS (MB) of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    rss = pss = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def miniwob_costs(envs: int, resets_per_env: int, steps_per_episode: int) -> dict[str, object]:
    """Reset and step times, start time and memory of real headless MiniWoB++ browsers."""
    section = load_config().env
    if shutil.which(section.chrome_binary) is None:
        return {"skipped": f"chromium not found at {section.chrome_binary}"}
    browsers = [MiniWoBEnv.from_config(section) for _ in range(envs)]
    start_s, reset_s, step_s, rss, pss = [], [], [], [], []
    try:
        for i, env in enumerate(browsers):
            rng = random.Random(i)
            tasks = miniwob_tasks(MINIWOB_TASKS, "train", resets_per_env)
            for n, task in enumerate(tasks):
                t0 = time.perf_counter()
                obs = await env.reset(task)
                (start_s if n == 0 else reset_s).append(time.perf_counter() - t0)
                for _ in range(steps_per_episode):
                    result = await env.step(rng.choice(env.candidates(obs)))
                    step_s.append(result.info.latency_s)
                    obs = result.observation
                    if result.done or result.truncated:
                        break
            pid = env.browser_pid
            assert pid is not None
            r, p = process_tree_memory_mb(pid)
            rss.append(r)
            pss.append(p)
    finally:
        await asyncio.gather(*(env.close() for env in browsers))
    return {
        "envs": envs,
        "start_s_mean": round(statistics.mean(start_s), 3),
        "reset_s_p50": round(percentile(reset_s, 0.5), 4),
        "reset_s_p95": round(percentile(reset_s, 0.95), 4),
        "step_s_p50": round(percentile(step_s, 0.5), 4),
        "step_s_p95": round(percentile(step_s, 0.95), 4),
        "resets": len(reset_s),
        "steps": len(step_s),
        "rss_mb_per_env": round(statistics.mean(rss), 1),
        "pss_mb_per_env": round(statistics.mean(pss), 1),
    }


async def main(quick: bool) -> dict[str, object]:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # "on one core"
    steps = 20_000 if quick else 100_000
    await sim_steps_per_s(2_000)  # warm-up: imports, caches
    runs = [await sim_steps_per_s(steps, seed) for seed in range(3)]
    sim_rate = statistics.median(cpu_rate for cpu_rate, _, _ in runs)
    overlap = await latency_overlap(envs=32 if quick else 128, steps=10 if quick else 20, mean_s=0.02)
    miniwob = await miniwob_costs(envs=2 if quick else 4, resets_per_env=12 if quick else 30, steps_per_episode=3)
    return {
        "name": "envs",
        "quick": quick,
        "ratio": round(sim_rate, 1),
        "target": TARGET_STEPS_PER_S,
        "metrics": {
            "sim_steps_per_cpu_s_runs": [round(cpu_rate, 1) for cpu_rate, _, _ in runs],
            "sim_steps_per_wall_s_runs": [round(wall_rate, 1) for _, wall_rate, _ in runs],
            "sim_steps_per_run": steps,
            "sim_episodes_per_run": runs[0][2],
            "load_average_1min": round(os.getloadavg()[0], 2),
            "sim_latency_overlap": overlap,
            "miniwob": miniwob,
            "python": sys.version.split()[0],
            "cpus_used": 1,
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, about a minute")
    args = parser.parse_args()
    result = asyncio.run(main(args.quick))
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))
    print(f"sim steps/s on one core: {result['ratio']:.0f} (target {TARGET_STEPS_PER_S:.0f})")
