"""`distrl-stream eval`: held-out success of a run's base model or published versions, with its interval."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import typer

from distrl_stream.cli.common import (
    BootstrapOption,
    ConfigOption,
    RunOption,
    build_config,
    err_console,
    field_option,
    progress_bar,
    run_command,
)


def evaluate(
    config: ConfigOption = None,
    run: RunOption = None,
    versions: Annotated[
        str,
        typer.Option(
            "--versions",
            help="What to evaluate: a version number (0 is the base model), latest, a range A-B (ends included, "
            "B may be latest), or a comma-separated list of these, e.g. 0,2-5,latest. Evaluated in ascending order.",
        ),
    ] = "latest",
    split: Annotated[
        Literal["test", "train"], typer.Option("--split", help="Task split: held-out test tasks, or train tasks.")
    ] = "test",
    tasks: Annotated[
        int, typer.Option("--tasks", "-n", help="Tasks: the first N of the split's fixed pool.", min=1)
    ] = 40,
    episodes_per_task: Annotated[
        int, typer.Option("--episodes-per-task", "-k", help="Episodes of each task.", min=1)
    ] = 1,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Environments running at once.", min=1)] = 8,
    server_url: Annotated[
        str | None,
        typer.Option(
            "--server-url",
            help="Evaluate on this running vLLM server (it must serve the run's base model and no other version of "
            "the policy, e.g. `serve --no-watch`), instead of starting one on every core of this machine.",
            show_default="start one",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="The JSON report (the Markdown one is written beside it, .md).",
            show_default="DATA_DIR/runs/RUN/eval/<UTC time>-<split>.json",
        ),
    ] = None,
    env: Annotated[str | None, field_option("env.kind", "--env", help="One of sim, miniwob, android.")] = None,
    latency: Annotated[str | None, field_option("env.latency", "--latency")] = None,
    model: Annotated[Path | None, field_option("model.base", "--model")] = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    bootstrap: BootstrapOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")] = False,
) -> None:
    """Held-out success of a run's base model or published versions: N tasks × K episodes each, per version.

    Each published version is verified (sha256) and hot-loaded, in ascending order, into a vLLM server started on
    every core of this machine (or --server-url). Prints the success rate with its 95% Wilson interval per version,
    publishes each result on {run}.metrics (role eval) and writes a JSON and a Markdown report.
    """
    cfg = build_config(
        config,
        run=run,
        data_dir=data_dir,
        kafka={"bootstrap_servers": bootstrap},
        model={"base": model},
        env={"kind": env, "latency": latency},
    )
    from distrl_stream.collector.heldout import (
        INTERVAL,
        EvalPlan,
        default_report_path,
        report,
        resolve_versions,
        run_evaluation,
        write_report,
    )

    plan = EvalPlan(split=split, tasks=tasks, episodes_per_task=episodes_per_task, concurrency=concurrency)
    episodes = len(run_command(plan.task_list, cfg))  # an unknown template fails here, before any server starts
    targets = run_command(resolve_versions, cfg, versions)
    server = None
    if server_url is None:
        from distrl_stream.inference.server import InferenceServer, start_on_cores
        from distrl_stream.policy.model_dir import resolve_model_dir

        log_path = cfg.run_dir / "logs" / "eval-vllm.log"
        inference = cfg.inference.model_copy(update={"port": 0})  # never the run's own server's port
        server = InferenceServer(run_command(resolve_model_dir, cfg), inference, cfg.model, log_path)
        cores = os.sched_getaffinity(0)
        err_console.print(
            f"starting vLLM ({server.device}) on {len(cores)} cores, log {log_path}", highlight=False, soft_wrap=True
        )
        run_command(start_on_cores, server, cores)
        server_url = server.url
    try:
        with tempfile.TemporaryDirectory(prefix="distrl-eval-") as staging, progress_bar("evaluating") as update:
            done = 0
            total = episodes * len(targets)
            update(done, total)

            def tick() -> None:
                nonlocal done
                done += 1
                update(done, total)

            results = run_command(
                run_evaluation, cfg, plan, targets, server_url, staging_dir=Path(staging), on_episode=tick
            )
    finally:
        if server is not None:
            server.stop()
    data = report(cfg, plan, results, server_url)
    json_path, markdown_path = write_report(data, out or default_report_path(cfg, plan))
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        for r in results:
            low, high = r.interval
            typer.echo(
                f"v{r.version}: {r.success_rate:.1%} ({low:.1%}-{high:.1%}), {r.successes}/{r.episodes} episodes, "
                f"{r.errors} errors"
            )
        typer.echo(f"{plan.tasks} {plan.split} tasks × {plan.episodes_per_task} episodes; interval: {INTERVAL}")
    err_console.print(f"report: {json_path} and {markdown_path}", highlight=False, soft_wrap=True)
