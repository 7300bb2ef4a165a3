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
  Selenium's chromedriver and chromium);
- **zero-shot** (``--zero-shot N``; ``zero_shot`` per adapter, else null): SmolLM2-135M-Instruct, the base model
  (version 0), on N test episodes per adapter (the subset's tasks in turn, test seeds 1, 3, 5, …: the same pages
  for both), through the project's own evaluation loop
  (:func:`~distrl_stream.collector.evaluation.evaluate_versions`, what ``distrl-stream eval`` runs) on a vLLM server
  started here on the model (``resolve_model_dir``; served as ``up``'s pretrained profile serves it), after the
  measurements above so it takes no CPU from them; choice mode, temperature 1, ``ZERO_SHOT_CONCURRENCY`` envs at a
  time; the success rate with its standard error and 95% Wilson interval. Printed beside :data:`PUBLISHED_MINIWOB`,
  which measured other models on all of MiniWoB++ in free mode: a different task set and action protocol, so a
  reference point, not a like-for-like comparison.

Headline ``ratio`` = BrowserGym's reachable share ÷ Selenium's (target 1.0: BrowserGym at least as good).

Usage: ``python bench/browsergym_miniwob.py [--quick] [--zero-shot N]`` writes
``bench/results/browsergym_miniwob.json`` (``--quick``: 4 suite tasks, 2 subset tasks, into ``bench/results/quick/``).
Not ``bench/browsergym.py``: a script of that name is what ``import browsergym`` finds first when it runs (its folder
leads ``sys.path``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from envs import percentile, process_tree_memory_mb  # bench/envs.py: the same measurements

from distrl_stream.cli.bench import write_results
from distrl_stream.collector.evaluation import evaluate_versions
from distrl_stream.config import InferenceConfig, ModelConfig, load_config
from distrl_stream.envs.base import EnvBase
from distrl_stream.envs.browsergym import BrowserGymEnv
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.miniwob_suite import check_suite, counts_by_reason, suite_tasks
from distrl_stream.envs.tasks import miniwob_tasks
from distrl_stream.inference.server import InferenceServer
from distrl_stream.orchestrate import PRETRAINED_UP_PROFILE
from distrl_stream.policy.model_dir import resolve_model_dir

TARGET = 1.0
EPISODES_PER_TASK = 8
BACKSTOP_S = 40.0
SEEDS = 3
ADAPTERS: Final = ("selenium", "browsergym")
ZERO_SHOT_MODEL = "smollm2-135m-instruct"
# Two envs at a time on two cores: a BrowserGym env's browser calls take turns on one thread anyway, and more
# Selenium envs would only queue behind the same server.
ZERO_SHOT_CONCURRENCY = 2
# The repository's data dir, wherever the script runs from: a model pulled by `up` or the other benches is reused.
DATA_DIR = Path(__file__).resolve().parents[1] / "distrl-data"
# MiniWoB++ success (%, ± standard error) of AgentLab's GenericAgent through BrowserGym, per model, from the
# leaderboard of the BrowserGym ecosystem. Found verbatim only as quoted from the leaderboard's result files: the
# paper's own table was not found to check them against, and the leaderboard's other GenericAgent rows
# (Llama-3.1-70b, Llama-3.1-405b, o1-mini, ...) were not found at all, so none is given.
PUBLISHED_MINIWOB: Final[dict[str, Any]] = {
    "source": "BrowserGym leaderboard, huggingface.co/spaces/ServiceNow/browsergym-leaderboard, "
    "results/<agent>/miniwob.json at commit 294ebe1, as quoted verbatim by a third party; the leaderboard of "
    "Le Sellier De Chezelles et al., 'The BrowserGym Ecosystem for Web Agent Research', arXiv 2412.05467 (2024), "
    "whose table was not found to check these against",
    "protocol": "AgentLab's MiniWoB++ benchmark: all 125 tasks, at most 10 steps an episode (AgentLab's README), "
    "625 episodes (the quote), free-form BrowserGym actions",
    "rows": [
        {"agent": "GenericAgent-Claude-3.5-Sonnet", "success_pct": 69.8, "stderr_pct": 1.8},
        {"agent": "GenericAgent-GPT-4o", "success_pct": 63.8, "stderr_pct": 1.9},
        {"agent": "GenericAgent-GPT-4o-mini", "success_pct": 56.6, "stderr_pct": 2.0},
    ],
}


def factories() -> dict[str, Callable[[], EnvBase]]:
    section = load_config().env
    return {
        "selenium": lambda: MiniWoBEnv.from_config(section),
        "browsergym": lambda: BrowserGymEnv(section.chrome_binary),
    }


def env_kind(adapter: str) -> str:
    """The ``env.kind`` of an adapter: ``miniwob`` for Selenium, ``browsergym`` for BrowserGym."""
    return "miniwob" if adapter == "selenium" else adapter


def task_names(adapter: str, names: list[str]) -> list[str]:
    """MiniWoB++ task names as the adapter's task templates (BrowserGym's ids: ``browsergym/miniwob.click-test``)."""
    return names if adapter == "selenium" else [f"browsergym/miniwob.{n}" for n in names]


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
    tasks = miniwob_tasks(task_names(kind, names), "test", episodes, env=env_kind(kind))
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


async def zero_shot(server_url: str, model_dir: Path, names: list[str], episodes: int, root: Path) -> dict[str, Any]:
    """Version 0's success per adapter on ``episodes`` test episodes of ``names``, through ``evaluate_versions``."""
    out: dict[str, Any] = {}
    for adapter in ADAPTERS:
        kind = env_kind(adapter)
        templates = task_names(adapter, names)
        cfg = load_config(
            None,
            data_dir=str(root / "data"),
            model={"base": str(model_dir)},
            inference={"url": server_url, "request_timeout_s": 60.0, **PRETRAINED_UP_PROFILE["inference"]},
            env={"kind": kind, "miniwob_tasks" if kind == "miniwob" else "browsergym_tasks": templates},
        )
        tasks = miniwob_tasks(templates, "test", episodes, env=kind)
        started = time.perf_counter()
        (result,) = await evaluate_versions(cfg, server_url, [0], tasks, concurrency=ZERO_SHOT_CONCURRENCY)
        low, high = result.interval
        p = result.success_rate
        out[adapter] = {
            "version": result.version,
            "episodes": result.episodes,
            "successes": result.successes,
            "success": round(p, 3),
            "stderr": round(math.sqrt(p * (1 - p) / result.episodes), 3),
            "wilson_95": [round(low, 3), round(high, 3)],
            "errors": result.errors,
            "mean_steps": round(result.mean_steps, 2),
            "by_task": {t.removeprefix("browsergym/miniwob."): list(c) for t, c in result.by_template.items()},
            "wall_s": round(time.perf_counter() - started, 1),
        }
        print(f"zero-shot {adapter}: {out[adapter]}", flush=True)
    return out


def serve_and_evaluate(names: list[str], episodes: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start a vLLM server on the zero-shot model, run :func:`zero_shot` on it, stop it; the results and settings."""
    model_dir = resolve_model_dir(load_config(None, data_dir=str(DATA_DIR), model={"base": ZERO_SHOT_MODEL}))
    inference = InferenceConfig(port=0, startup_timeout_s=600.0, **PRETRAINED_UP_PROFILE["inference"])
    with tempfile.TemporaryDirectory(prefix="bench-browsergym-miniwob-") as tmp:
        started = time.perf_counter()
        with InferenceServer(model_dir, inference, ModelConfig(), Path(tmp) / "vllm.log") as server:
            server_start_s = round(time.perf_counter() - started, 1)
            results = asyncio.run(zero_shot(server.url, model_dir, names, episodes, Path(tmp)))
    settings = {
        "model": ZERO_SHOT_MODEL,
        "episodes_per_adapter": episodes,
        "tasks": names,
        "split": "test",
        "mode": "choice",
        "temperature": 1.0,
        "concurrency": ZERO_SHOT_CONCURRENCY,
        "server": {**PRETRAINED_UP_PROFILE["inference"], "cores": len(os.sched_getaffinity(0))},
        "server_start_s": server_start_s,
        "interval": "Wilson score interval, 95%",
    }
    return results, settings


async def main(quick: bool) -> dict[str, Any]:
    section = load_config().env
    suite = suite_tasks()[::4][: 4 if quick else None]
    subset = section.miniwob_tasks[: 2 if quick else None]
    # The test seeds of the random-candidate episodes (SEEDS rounds over the subset): the oracle plays the same pages.
    seeds = sorted({task.seed for task in miniwob_tasks(subset, "test", len(subset) * SEEDS)})
    adapters: dict[str, dict[str, Any]] = {}
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
        (a["task"], a["reachable"], b["reachable"]) for a, b in zip(selenium["rows"], browsergym["rows"], strict=True)
    ]
    return {
        "name": "browsergym_miniwob",
        "quick": quick,
        "ratio": round(browsergym["reachable"] / max(selenium["reachable"], 1e-9), 3),
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
            "step_time_ratio_p50": round(browsergym["step_s_p50"] / selenium["step_s_p50"], 1),
        },
    }


def comparison(metrics: dict[str, Any]) -> str:
    """The zero-shot success per adapter beside the published rows, as lines to print."""
    lines = []
    for adapter, data in metrics["adapters"].items():
        shot = data["zero_shot"]
        if shot is not None:
            low, high = shot["wilson_95"]
            lines.append(
                f"SmolLM2-135M zero-shot, {adapter}: {100 * shot['success']:.1f} ± {100 * shot['stderr']:.1f} % "
                f"(95% Wilson {100 * low:.1f}-{100 * high:.1f}), {shot['successes']}/{shot['episodes']} episodes of "
                f"{len(metrics['zero_shot_settings']['tasks'])} subset tasks, choice mode"
            )
    for row in PUBLISHED_MINIWOB["rows"]:
        lines.append(f"{row['agent']}: {row['success_pct']} ± {row['stderr_pct']} % (all of MiniWoB++, free mode)")
    return "\n".join([*lines, f"published: {PUBLISHED_MINIWOB['source']}"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 suite tasks and 2 subset tasks (a few minutes)")
    parser.add_argument(
        "--zero-shot",
        type=int,
        default=0,
        metavar="N",
        help=f"also measure {ZERO_SHOT_MODEL}'s zero-shot success on N test episodes per adapter (a vLLM server)",
    )
    args = parser.parse_args()
    if args.zero_shot < 0:
        parser.error("--zero-shot: a number of episodes, 0 or more")
    result = asyncio.run(main(args.quick))
    metrics = result["metrics"]
    shots, settings = serve_and_evaluate(metrics["subset_tasks"], args.zero_shot) if args.zero_shot else ({}, None)
    for adapter, data in metrics["adapters"].items():
        data["zero_shot"] = shots.get(adapter)
    metrics["zero_shot_settings"] = settings
    metrics["published_miniwob"] = PUBLISHED_MINIWOB
    write_results(__file__, result, quick=args.quick)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("adapters", "published_miniwob")}, indent=2))
    print(f"BrowserGym reaches {result['ratio']:.2f}x the suite share Selenium does (target {TARGET})")
    print(comparison(metrics))
