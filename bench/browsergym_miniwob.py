"""MiniWoB++ measured both ways: our Selenium adapter (``env.kind = "miniwob"``) beside BrowserGym (``"browsergym"``).

The same MiniWoB++ pages (the ``miniwob`` package's), the same seeds and the same search, per adapter:

- **reachable**: the share of a sample of the suite (every 4th task, 32 of 125) that some sequence of the adapter's own
  choice-mode candidates solves (:func:`distrl_stream.envs.miniwob_suite.check_suite`: the scripted oracle here, the
  same depth-first search over candidates for both; the same episode budget for both, since a BrowserGym reset costs
  ten times a Selenium one, with a time budget only as a backstop);
- **oracle success** (``oracle_success``) on the learnable subset: the share of its test episodes, the 8 tasks of
  ``env.miniwob_tasks`` × 3 test seeds (1, 3, 5: the random-candidate episodes' pages), that the same search solves
  on that (task, seed): :func:`~distrl_stream.envs.miniwob_suite.check_suite` run once per seed, with the suite's
  budget per (task, seed) for both adapters (``EPISODES_PER_TASK`` resets, ``BACKSTOP_S`` as the backstop), so an
  episode counts when some sequence of at most 3 screen changes through the adapter's candidates earns the page's
  reward; what a policy choosing among those candidates can reach on those pages;
- **random-candidate success** on the same subset episodes (a uniform choice among the candidates at every step): how
  much of the task the candidate set gives away;
- **costs**: start, reset and step times, steps per second of one env (its resets included), and memory per env (PSS
  of the browser processes; BrowserGym's two chromiums, the task's and its chat window's, and its Playwright driver;
  Selenium's chromedriver and chromium).

Headline ``ratio`` = BrowserGym's reachable share ÷ Selenium's (target 1.0: BrowserGym at least as good). Zero-shot
SmolLM2 success is not measured here (it needs a vLLM server on a free CPU for tens of minutes per adapter).

Usage: ``python bench/browsergym_miniwob.py [--quick]`` writes ``bench/results/browsergym_miniwob.json`` (``--quick``:
4 suite tasks, 2 subset tasks). Not ``bench/browsergym.py``: a script of that name is what ``import browsergym`` finds
first when it runs (its folder leads ``sys.path``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from envs import percentile, process_tree_memory_mb  # bench/envs.py: the same measurements

from distrl_stream.cli.bench import write_results
from distrl_stream.config import load_config
from distrl_stream.envs.base import EnvBase
from distrl_stream.envs.browsergym import BrowserGymEnv
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.miniwob_suite import check_suite, counts_by_reason, suite_tasks
from distrl_stream.envs.tasks import miniwob_tasks

TARGET = 1.0
EPISODES_PER_TASK = 8
BACKSTOP_S = 40.0
SEEDS = 3


def factories() -> dict[str, Callable[[], EnvBase]]:
    section = load_config().env
    return {
        "selenium": lambda: MiniWoBEnv.from_config(section),
        "browsergym": lambda: BrowserGymEnv(section.chrome_binary),
    }


def browser_root(env: EnvBase) -> int:
    """The process whose tree holds the env's browsers: chromedriver, or this process's Playwright driver."""
    if isinstance(env, MiniWoBEnv):
        pid = env.browser_pid
        assert pid is not None
        return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == os.getpid() and b"playwright" in cmdline:
                return int(entry.name)
    raise RuntimeError("no Playwright driver under this process")


async def oracle(factory: Callable[[], EnvBase], names: list[str], seeds: list[int]) -> dict[str, object]:
    """The search's success on every (task, seed) of the subset's test episodes, with the suite's budget."""
    rows = []
    for seed in seeds:
        found = await check_suite(
            names, seed=seed, budget_s=BACKSTOP_S, max_episodes=EPISODES_PER_TASK, env_factory=factory
        )
        rows += [{"seed": seed, **dataclasses.asdict(row)} for row in found]
    return {
        "oracle_success": round(sum(bool(r["reachable"]) for r in rows) / len(rows), 3),
        "oracle_episodes": len(rows),
        "oracle_rows": rows,
    }


async def costs(factory: Callable[[], EnvBase], kind: str, names: list[str], episodes: int) -> dict[str, object]:
    """Start, reset and step times of one env over random-candidate episodes, then memory with two envs open."""
    template = (lambda n: n) if kind == "selenium" else (lambda n: f"browsergym/miniwob.{n}")
    tasks = miniwob_tasks([template(n) for n in names], "test", episodes, env="miniwob" if kind == "selenium" else kind)
    rng = random.Random(0)
    envs = [factory(), factory()]
    start_s, reset_s, step_s, successes = [], [], [], 0
    try:
        for n, task in enumerate(tasks):
            t0 = time.perf_counter()
            obs = await envs[0].reset(task)
            (start_s if n == 0 else reset_s).append(time.perf_counter() - t0)
            while True:
                result = await envs[0].step(rng.choice(envs[0].candidates(obs)))
                step_s.append(result.info.latency_s)
                obs = result.observation
                if result.done or result.truncated:
                    successes += result.info.success
                    break
        await envs[1].reset(tasks[0])
        rss, pss = process_tree_memory_mb(browser_root(envs[0]))
        if kind == "selenium":  # each env has its own chromedriver tree
            second = process_tree_memory_mb(browser_root(envs[1]))
            rss, pss = rss + second[0], pss + second[1]
    finally:
        for env in envs:
            await env.close()
    return {
        "random_success": round(successes / len(tasks), 3),
        "random_success_se": round(math.sqrt(max(successes, 1) * (len(tasks) - successes) / len(tasks) ** 3), 3),
        "episodes": len(tasks),
        "start_s": round(start_s[0], 2),
        "reset_s_p50": round(percentile(reset_s, 0.5), 3),
        "step_s_p50": round(percentile(step_s, 0.5), 3),
        "step_s_p95": round(percentile(step_s, 0.95), 3),
        "steps_per_s_one_env": round(len(step_s) / (sum(step_s) + sum(reset_s) + start_s[0]), 2),
        "rss_mb_per_env": round(rss / 2, 1),
        "pss_mb_per_env": round(pss / 2, 1),
    }


async def main(quick: bool) -> dict[str, object]:
    section = load_config().env
    suite = suite_tasks()[::4][: 4 if quick else None]
    subset = section.miniwob_tasks[: 2 if quick else None]
    # The test seeds of the random-candidate episodes (SEEDS rounds over the subset): the oracle plays the same pages.
    seeds = sorted({task.seed for task in miniwob_tasks(subset, "test", len(subset) * SEEDS)})
    adapters: dict[str, dict[str, object]] = {}
    for kind, factory in factories().items():
        started = time.perf_counter()
        rows = await check_suite(suite, budget_s=BACKSTOP_S, max_episodes=EPISODES_PER_TASK, env_factory=factory)
        counts = counts_by_reason(rows)
        solved = await oracle(factory, subset, seeds)
        measured = await costs(factory, kind, subset, len(subset) * SEEDS)
        adapters[kind] = {
            "reachable": round(counts["reachable"] / len(rows), 3),
            "counts": counts,
            **solved,
            **measured,
            "wall_s": round(time.perf_counter() - started, 1),
            "rows": [dataclasses.asdict(row) for row in rows],
        }
        print(kind, {k: v for k, v in adapters[kind].items() if not k.endswith("rows")}, flush=True)
    selenium, browsergym = adapters["selenium"], adapters["browsergym"]
    both = [
        (a["task"], a["reachable"], b["reachable"])
        for a, b in zip(selenium["rows"], browsergym["rows"], strict=True)  # type: ignore[call-overload]
    ]
    return {
        "name": "browsergym_miniwob",
        "quick": quick,
        "ratio": round(float(browsergym["reachable"]) / max(float(selenium["reachable"]), 1e-9), 3),  # type: ignore[arg-type]
        "target": TARGET,
        "metrics": {
            "suite_tasks": len(suite),
            "subset_tasks": subset,
            "subset_test_seeds": seeds,
            "episodes_per_task": EPISODES_PER_TASK,
            "only_selenium": [task for task, a, b in both if a and not b],
            "only_browsergym": [task for task, a, b in both if b and not a],
            "load_average_1min": round(os.getloadavg()[0], 2),
            "cpus": len(os.sched_getaffinity(0)),
            "adapters": adapters,
            "zero_shot_smollm2": "not measured",
            "step_time_ratio_p50": round(float(browsergym["step_s_p50"]) / float(selenium["step_s_p50"]), 1),  # type: ignore[arg-type]
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 suite tasks and 2 subset tasks (a few minutes)")
    args = parser.parse_args()
    result = asyncio.run(main(args.quick))
    write_results(__file__, result, quick=args.quick)
    metrics = result["metrics"]
    print(json.dumps({k: v for k, v in metrics.items() if k != "adapters"}, indent=2))  # type: ignore[union-attr]
    print(f"BrowserGym reaches {result['ratio']:.2f}x the suite share Selenium does (target {TARGET})")
