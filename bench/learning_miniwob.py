"""A real benchmark learns: A-RIDE async on MiniWoB++ (the default 8-task subset, real headless chromium), 2 cores.

One run of the whole system, as `up` would run it, on the real benchmark instead of the simulator: an embedded broker,
one vLLM server on the tiny local model, one collector with K chromium-backed environments (async), and one A-RIDE
learner confined to a core of its own (as on its own machine, see ``bench/learning.py``). No warm start: the policy
starts from the untrained model, and the run is ``--budget`` seconds of training (default 600: with start-up and the
evaluations the whole script stays within 15 minutes on 2 cores).

Held-out success (test-split seeds of the same 8 tasks, one episode each, ``--eval-tasks``) of:

- the **untrained** policy (version 0, the base model, what the server serves before any version);
- a **random reference**: a uniformly random candidate at every step (``ScriptedPolicy`` without an oracle), which is
  what an untrained policy with no preference among candidates would score;
- the **trained** versions over time (``--points`` of them, always the last).

All three are evaluated after training, on the same server restarted on every core (``serve_evaluations_on_every_core``
in ``bench/learning.py``), so evaluation never takes CPU from training and every policy is timed alike (a MiniWoB++
episode has a time limit).

Model: the tiny model (0.33M parameters): it is the only one that trains at several updates per minute on one CPU
core while chromium, vLLM and the collector share the other; the choice-mode action space (the env's own candidates)
is what makes it learnable at all.

Headline: ``ratio`` = final trained ÷ untrained held-out success (the untrained score is floored at one success in
``--eval-tasks`` when it is 0, and ``metrics`` says so). Writes ``bench/results/learning_miniwob.json`` and
``bench/results/learning_miniwob.png``.

Usage: ``python bench/learning_miniwob.py [--quick] [--budget S] [--envs K] [--eval-tasks N] [--points P]``
(``--quick``: 120 s of training, 16 evaluation tasks, 3 versions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from learning import (
    LEARNER,
    MINIWOB_BROWSERS,
    area_under,
    evaluate_curve,
    local_services,
    pick_versions,
    serve_evaluations_on_every_core,
    split_cores,
    train,
)

from distrl_stream.cli.bench import results_file, write_results
from distrl_stream.collector.evaluation import evaluate, evaluate_policy, held_out_tasks
from distrl_stream.config import load_config
from distrl_stream.testing.scripted import ScriptedPolicy

METHOD = "aride_async"

log = logging.getLogger("bench.learning_miniwob")


def plot(curve: list[dict[str, Any]], untrained: float, random_play: float, budget_s: float, path: Path) -> None:
    """Held-out success of the trained versions over time, with the untrained and random references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot([p["seconds"] / 60 for p in curve], [p["success"] for p in curve], marker="o", label="A-RIDE async")
    ax.axhline(untrained, color="black", linestyle=":", linewidth=1, label="untrained (version 0)")
    ax.axhline(random_play, color="grey", linestyle="--", linewidth=1, label="random candidate")
    ax.set_xlim(0, budget_s / 60)
    ax.set_ylim(0, 1)
    ax.set_xlabel("wall-clock minutes since launch")
    ax.set_ylabel("held-out success")
    ax.set_title("MiniWoB++ (8-task subset, headless chromium): held-out success over time")
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # results/quick/ on a first quick run
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120 s of training, 16 evaluation tasks, 3 versions")
    parser.add_argument("--budget", type=float, help="seconds of training (default 600, quick 120)")
    parser.add_argument("--envs", type=int, default=4, help="K: chromium environments of the collector")
    parser.add_argument("--eval-tasks", type=int, help="held-out tasks per evaluation (default 40: 5 per task)")
    parser.add_argument(
        "--eval-browsers", type=int, default=MINIWOB_BROWSERS, help="chromium environments per evaluation"
    )
    parser.add_argument("--points", type=int, help="versions evaluated (default 5, quick 3)")
    args = parser.parse_args()
    args.budget = args.budget or (120.0 if args.quick else 600.0)
    args.eval_tasks = args.eval_tasks or (16 if args.quick else 40)
    args.points = args.points or (3 if args.quick else 5)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    learner_cores, serving_cores = split_cores(shared=False)
    if serving_cores is not None:
        os.sched_setaffinity(0, serving_cores)

    with tempfile.TemporaryDirectory(prefix="bench-learning-miniwob-") as tmp:
        root = Path(tmp)
        with local_services(root) as services:
            model_dir, bootstrap, server_url = services.model_dir, services.bootstrap, services.url
            base: dict[str, Any] = {
                "run": f"bench-miniwob-{uuid.uuid4().hex[:6]}",
                "data_dir": str(root / "data"),
                "kafka": {"bootstrap_servers": bootstrap},
                "model": {"base": str(model_dir)},
                "inference": {"url": server_url, "request_timeout_s": 60.0},
                "env": {"kind": "miniwob"},
                "learner": dict(LEARNER),
                "artifacts": {"store": "file", "keep_versions": 1_000_000},  # each version is evaluated after training
            }
            cfg = load_config(None, **base)
            tasks = held_out_tasks(cfg, args.eval_tasks)

            run = train(METHOD, base, root, server_url, args.budget, args.envs, learner_cores)
            serve_evaluations_on_every_core(services, learner_cores, serving_cores)
            # The references are evaluated as the versions are, after training on the same cores: an episode's time
            # limit makes MiniWoB++ outcomes depend on speed.
            untrained = asyncio.run(evaluate(cfg, tasks, concurrency=args.eval_browsers, version=0))

            from transformers import AutoTokenizer

            random_policy = ScriptedPolicy(None, AutoTokenizer.from_pretrained(model_dir), 1.0, random.Random(0))
            random_play = asyncio.run(evaluate_policy(cfg, tasks, random_policy, concurrency=args.eval_browsers))
            log.info("untrained %.2f, random %.2f", untrained.success_rate, random_play.success_rate)
            picked = pick_versions(run, args.budget, args.points)
            curve, _ = asyncio.run(
                evaluate_curve(cfg, server_url, root / "staging", run, picked, tasks, concurrency=args.eval_browsers)
            )

    floor = 1 / args.eval_tasks
    final = curve[-1]["success"] if curve else 0.0
    ratio = final / max(untrained.success_rate, floor)
    plot(
        curve,
        untrained.success_rate,
        random_play.success_rate,
        args.budget,
        results_file(__file__, quick=args.quick).with_suffix(".png"),
    )
    result: dict[str, Any] = {
        "name": "learning_miniwob",
        "quick": args.quick,
        "ratio": ratio,
        "target": 1.0,
        "metrics": {
            "ratio_note": "final trained / untrained held-out success; an untrained score of 0 counts as "
            f"{floor:.3f} (one success in {args.eval_tasks})" + (" (floored here)" if untrained.successes == 0 else ""),
            "untrained_success": untrained.success_rate,
            "untrained_by_task": untrained.by_template,
            "random_success": random_play.success_rate,
            "random_by_task": random_play.by_template,
            "final_success": final,
            "final_by_task": curve[-1]["by_template"] if curve else {},
            "best_success": max((p["success"] for p in curve), default=None),
            "auc": area_under(curve, args.budget),
            "curve": curve,
            "learner_stats": run.learner_stats,
            "versions_published": len(run.versions),
            "trajectories": run.trajectories,
            "learner_updates": run.learner_updates,
            "budget_s": args.budget,
            "envs": args.envs,
            "tasks": cfg.env.miniwob_tasks,
            "eval_tasks": args.eval_tasks,
            "learner": LEARNER,
            "model": "tiny (0.33M parameters, LoRA rank 8 on all projections), from scratch (no warm start)",
            "wall_s": time.monotonic() - started,
            "load_average_1min": os.getloadavg()[0],
        },
    }
    write_results(__file__, result, quick=args.quick)
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}, indent=2))


if __name__ == "__main__":
    main()
