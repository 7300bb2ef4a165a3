"""MiniWoB++ beyond the subset: how many tasks of the installed suite the adapter's own candidates can solve.

Headline (issue 16): ``ratio`` = tasks reachable through ``MiniWoBEnv``'s choice-mode candidates ÷ tasks in the suite
(every MiniWoB++ task the ``miniwob`` package registers; FlightWoB's three are a separate benchmark); target 0.6.
Each task gets one page seed and a bounded depth-first search over candidate sequences, re-running the seed per
branch (:mod:`distrl_stream.envs.miniwob_suite`). ``metrics`` carry the counts by reason and the whole table.

Usage: ``python bench/miniwob_suite.py [--quick]`` writes ``bench/results/miniwob_suite.json`` (``--quick``: a sample
of 12 tasks, 5 s each).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from distrl_stream.cli.bench import write_results
from distrl_stream.config import load_config
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.miniwob_suite import SuiteRow, check_suite, counts_by_reason, suite_tasks

TARGET = 0.6
BUDGET_S = 10.0
QUICK_TASKS = 12


async def main(quick: bool) -> dict[str, object]:
    section = load_config().env
    tasks = suite_tasks()
    if quick:
        tasks = tasks[:: max(1, len(tasks) // QUICK_TASKS)][:QUICK_TASKS]
    budget_s = 5.0 if quick else BUDGET_S
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as bar:
        job = bar.add_task("MiniWoB++ suite", total=len(tasks))
        reachable = 0

        def advance(row: SuiteRow, done: int, total: int) -> None:
            nonlocal reachable
            reachable += row.reachable
            bar.update(job, completed=done, description=f"MiniWoB++ suite: {reachable} reachable, last {row.task}")

        rows = await check_suite(
            tasks, budget_s=budget_s, progress=advance, env_factory=lambda: MiniWoBEnv.from_config(section)
        )
    counts = counts_by_reason(rows)
    return {
        "name": "miniwob_suite",
        "quick": quick,
        "ratio": round(counts["reachable"] / len(rows), 3),
        "target": TARGET,
        "metrics": {
            "tasks": len(rows),
            "counts": counts,
            "budget_s_per_task": budget_s,
            "wall_s": round(time.perf_counter() - started, 1),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "rows": [dataclasses.asdict(row) for row in rows],
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TASKS} tasks, 5 s each (about a minute)")
    args = parser.parse_args()
    result = asyncio.run(main(args.quick))
    write_results(__file__, result, quick=args.quick)
    metrics = result["metrics"]
    print(json.dumps({k: v for k, v in metrics.items() if k != "rows"}, indent=2))  # type: ignore[union-attr]
    print(f"reachable: {result['ratio']:.0%} of the suite (target {TARGET:.0%})")
