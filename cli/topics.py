"""`distrl-stream topics ...`: the Kafka topics of a run ({run}.trajectories, .weights, .artifacts, .metrics, .dlq)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from distrl_stream.cli.common import BootstrapOption, ConfigOption, RunOption, build_config, fail, run_command
from distrl_stream.config import Config
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.topics import TOPIC_KINDS, TopicNames, delete_run_topics, ensure_run_topics

app = typer.Typer(help="List, create, describe and delete the Kafka topics of a run.", no_args_is_help=True)

TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each answer from the cluster.")]


def _config(config: Path | None, run: str | None, bootstrap: str | None) -> Config:
    return build_config(config, run=run, kafka={"bootstrap_servers": bootstrap})


@app.command("list")
def list_topics(
    config: ConfigOption = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Only this run's topics.", show_default="every run on the cluster")
    ] = None,
    bootstrap: BootstrapOption = None,
    timeout: TimeoutOption = 10.0,
) -> None:
    """List runs and their topics (partitions) on the cluster."""
    cfg = _config(config, run, bootstrap)
    admin = Admin(cfg.kafka, timeout_s=timeout)
    topics = run_command(admin.topics)
    table = Table("run", "topic", "partitions")
    for name in sorted(topics):
        topic_run, _, kind = name.rpartition(".")
        if kind in TOPIC_KINDS and topic_run and (run is None or topic_run == run):
            table.add_row(topic_run, name, str(topics[name]))
    if table.row_count == 0:
        typer.echo(f"no run topics{f' for run {run}' if run else ''} at {cfg.kafka.bootstrap_servers}")
        return
    Console().print(table)


@app.command("create")
def create(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Create the run's five topics with their configs where missing (roles also do this when they start)."""
    cfg = _config(config, run, bootstrap)
    names = run_command(ensure_run_topics, cfg, Admin(cfg.kafka, timeout_s=timeout))
    typer.echo("\n".join(names.all()))


@app.command("describe")
def describe(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Show each topic of the run: partitions with leader and offsets, and the topic configs that are set."""
    cfg = _config(config, run, bootstrap)
    admin = Admin(cfg.kafka, timeout_s=timeout)
    existing = run_command(admin.topics)
    names = [n for n in TopicNames(cfg.run).all() if n in existing]
    if not names:
        fail(f"run {cfg.run} has no topics at {cfg.kafka.bootstrap_servers}")
    infos = [run_command(admin.describe_topic, n) for n in names]
    if as_json:
        out = {
            i.name: {
                "messages": i.messages,
                "config": i.config,
                "partitions": [
                    {"partition": p.partition, "leader": p.leader, "replicas": p.replicas, "low": p.low, "high": p.high}
                    for p in i.partitions
                ],
            }
            for i in infos
        }
        typer.echo(json.dumps(out, indent=2))
        return
    console = Console()
    for info in infos:
        table = Table("partition", "leader", "replicas", "low", "high", title=f"{info.name} ({info.messages} records)")
        for p in info.partitions:
            table.add_row(str(p.partition), str(p.leader), str(p.replicas), str(p.low), str(p.high))
        console.print(table)
        console.print("  " + ", ".join(f"{k}={v}" for k, v in sorted(info.config.items())), highlight=False)


@app.command("delete")
def delete(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Delete the run's topics and everything in them (trajectories, weight versions, metrics, dead letters)."""
    cfg = _config(config, run, bootstrap)
    if not yes:
        typer.confirm(f"Delete all topics of run {cfg.run} at {cfg.kafka.bootstrap_servers}?", abort=True)
    deleted = run_command(delete_run_topics, cfg, Admin(cfg.kafka, timeout_s=timeout))
    typer.echo(f"deleted {len(deleted)} topics" + (f": {', '.join(sorted(deleted))}" if deleted else ""))
