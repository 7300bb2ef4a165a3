"""`distrl-stream envs ...`: check environments before training on them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from distrl_stream.cli.common import ConfigOption, build_config, fail, progress_bar, run_command

app = typer.Typer(help="Check the environments: which MiniWoB++ tasks the adapter can solve.", no_args_is_help=True)


@app.command("miniwob-check")
def miniwob_check(
    task: Annotated[
        list[str] | None,
        typer.Option("--task", help="A MiniWoB++ task name (repeatable); default: every task the package registers."),
    ] = None,
    budget_s: Annotated[float, typer.Option("--budget-s", min=0.1, help="Wall-clock seconds per task.")] = 10.0,
    max_depth: Annotated[int, typer.Option("--max-depth", min=1, help="Longest candidate sequence tried.")] = 3,
    seed: Annotated[int, typer.Option("--seed", help="The page seed of every task.")] = 0,
    markdown: Annotated[
        Path | None,
        typer.Option(
            "--markdown", help="Also write the support table (Markdown) to this file.", show_default="not written"
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Run tasks of the installed MiniWoB++ suite through the adapter: a bounded search over its own choice-mode
    candidates (the same page seed re-run per branch) says, per task, whether the page's reward is reachable and,
    if not, why (unsupported widget, search budget, error). Needs headless chromium (`make setup` installs it)."""
    # selenium and gymnasium load only when the check runs, so `--help` stays fast.
    from distrl_stream.envs.miniwob import MiniWoBEnv
    from distrl_stream.envs.miniwob_suite import check_suite, counts_by_reason, markdown_table, suite_tasks

    section = build_config(config).env
    names = task or suite_tasks()
    unknown = sorted(set(names) - set(suite_tasks()))
    if unknown:
        fail(f"--task: unknown MiniWoB++ task(s) {', '.join(unknown)} (see docs/envs.md for the suite)", code=2)
    with progress_bar("MiniWoB++ suite") as update:
        rows = run_command(
            asyncio.run,
            check_suite(
                names,
                seed=seed,
                budget_s=budget_s,
                max_depth=max_depth,
                progress=lambda _row, done, total: update(done, total),
                env_factory=lambda: MiniWoBEnv.from_config(section),
            ),
        )
    table = markdown_table(rows)
    typer.echo(table)
    counts = counts_by_reason(rows)
    summary = ", ".join(f"{reason} {n}" for reason, n in counts.items())
    typer.echo(f"{counts['reachable']} of {len(rows)} tasks reachable ({summary})")
    if markdown is not None:
        markdown.write_text(table + "\n", encoding="utf-8")
