"""`distrl-stream replay ...`: read a run's recorded trajectories back for statistics, exports, reports and
offline-to-online training, without ever joining the learner's consumer group."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from distrl_stream.analysis.replay import (
    EpisodeSummary,
    ReadCounts,
    ReplaySelection,
    read_trajectories,
    read_weight_versions,
)
from distrl_stream.cli.common import (
    BootstrapOption,
    ConfigOption,
    RunOption,
    build_config,
    err_console,
    fail,
    field_option,
    parse_time,
    progress_bar,
    run_command,
)
from distrl_stream.cli.learn import ReplayAlgorithm, learn
from distrl_stream.config import Config
from distrl_stream.errors import ConfigError

app = typer.Typer(
    help="Replay a run's trajectories from Kafka (by time range or offsets, never touching the learner's group): "
    "statistics, Parquet/JSONL export, plots, and offline warm starts of a learner.",
    no_args_is_help=True,
)

SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="First record time: ISO 8601 (naive = UTC), or an age such as 30m, 2h, 1d.",
        show_default="the beginning",
    ),
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help="End time, exclusive (same forms as --since).", show_default="now"),
]
PartitionOption = Annotated[
    list[int] | None,
    typer.Option("--partition", "-p", help="Only this partition of {run}.trajectories; repeatable.", min=0),
]
StartOffsetOption = Annotated[
    int | None,
    typer.Option("--start-offset", help="First offset read in each partition (inclusive).", min=0, show_default="0"),
]
EndOffsetOption = Annotated[
    int | None,
    typer.Option(
        "--end-offset",
        help="Offset where each partition's read stops (exclusive).",
        min=1,
        show_default="the high watermark when the replay starts",
    ),
]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds the whole read may take.", min=1)]


def _config(config: Path | None, run: str | None, bootstrap: str | None) -> Config:
    return build_config(config, run=run, kafka={"bootstrap_servers": bootstrap})


def _selection(
    since: str | None,
    until: str | None,
    partitions: list[int] | None,
    start_offset: int | None,
    end_offset: int | None,
) -> ReplaySelection:
    try:
        return ReplaySelection(
            since=parse_time(since, "--since"),
            until=parse_time(until, "--until"),
            partitions=frozenset(partitions) if partitions else None,
            start_offset=start_offset,
            end_offset=end_offset,
        )
    except ConfigError as exc:
        fail(str(exc), code=2)


def _read_episodes(cfg: Config, selection: ReplaySelection, timeout: float) -> list[EpisodeSummary]:
    counts = ReadCounts()

    def read() -> list[EpisodeSummary]:
        with progress_bar(f"reading {cfg.run}.trajectories") as update:
            records = read_trajectories(
                cfg.kafka, cfg.run, selection, counts=counts, progress=update, timeout_s=timeout
            )
            return [EpisodeSummary.from_record(r) for r in records]

    episodes: list[EpisodeSummary] = run_command(read)
    _warn_undecodable(counts)
    return episodes


def _warn_undecodable(counts: ReadCounts) -> None:
    if counts.undecodable:
        err_console.print(
            f"[yellow]warning:[/] skipped {counts.undecodable} records that do not decode "
            f"(first: {counts.first_error})",
            highlight=False,
            soft_wrap=True,
        )


@app.command("stats")
def stats(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    partition: PartitionOption = None,
    start_offset: StartOffsetOption = None,
    end_offset: EndOffsetOption = None,
    timeout: TimeoutOption = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON.")] = False,
) -> None:
    """Episodes, success rate (overall and by task), episode lengths, policy-version lag and latencies."""
    from distrl_stream.analysis.stats import compute_stats

    cfg = _config(config, run, bootstrap)
    selection = _selection(since, until, partition, start_offset, end_offset)
    episodes = _read_episodes(cfg, selection, timeout)
    weights = run_command(read_weight_versions, cfg.kafka, cfg.run)
    result = compute_stats(episodes, weights)
    if as_json:
        typer.echo(json.dumps({"run": cfg.run, "selection": selection.describe(), **result.to_dict()}, indent=2))
        return
    console = Console()
    if result.episodes == 0:
        console.print(f"run {cfg.run}: no trajectories in the selection ({selection.describe()})", highlight=False)
        return
    overview = Table("run " + cfg.run, "", show_header=True, title=f"selection: {selection.describe()}")
    rows = [
        ("episodes", f"{result.episodes} ({result.steps} steps, {result.invalid_steps} invalid)"),
        ("success rate", f"{100 * result.success_rate:.1f}%"),
        ("throughput", f"{result.trajectories_per_min:.1f} trajectories/min over {result.span_s / 60:.1f} min"),
        ("collectors", str(len(result.by_collector))),
        ("episode length", f"mean {result.length.mean:.1f}  p95 {result.length.p95:.0f}  max {result.length.max:.0f}"),
        (
            "policy versions",
            f"{result.min_policy_version}..{result.max_policy_version} acting, "
            f"{result.versions_published} in {cfg.run}.weights",
        ),
        (
            "version lag",
            f"mean {result.version_lag.mean:.2f}  p95 {result.version_lag.p95:.0f}  max {result.version_lag.max:.0f}",
        ),
        ("inference latency", _ms(result.inference_latency_s.p50, result.inference_latency_s.p95)),
        ("env step latency", _ms(result.env_latency_s.p50, result.env_latency_s.p95)),
        ("terminations", ", ".join(f"{k} {v}" for k, v in result.terminations.items())),
    ]
    for name, value in rows:
        overview.add_row(name, value)
    console.print(overview)
    tasks = Table("task", "episodes", "success", "mean length", title="by task")
    for t in result.by_task:
        tasks.add_row(t.task, str(t.episodes), f"{100 * t.success_rate:.0f}%", f"{t.mean_length:.1f}")
    console.print(tasks)


def _ms(p50: float, p95: float) -> str:
    return f"p50 {1000 * p50:.0f} ms  p95 {1000 * p95:.0f} ms"


@app.command("export")
def export(
    output: Annotated[Path, typer.Argument(help="Output file: .parquet or .jsonl (or give --format).")],
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    per: Annotated[
        Literal["episode", "step"], typer.Option("--per", help="One row per episode, or one row per step.")
    ] = "episode",
    fmt: Annotated[
        Literal["parquet", "jsonl"] | None,
        typer.Option("--format", help="File format.", show_default="from the file suffix"),
    ] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    partition: PartitionOption = None,
    start_offset: StartOffsetOption = None,
    end_offset: EndOffsetOption = None,
    timeout: TimeoutOption = 600.0,
    images: Annotated[
        bool,
        typer.Option(
            "--images",
            help="Also draw a contact sheet of each episode that has screenshots, into a folder beside OUTPUT "
            "named after it (runs/x.parquet: runs/x.images/EPISODE_ID.png): the screenshots left to right, each "
            "captioned with its step, reward and action. A screenshot that is missing or altered becomes a grey "
            "tile saying why.",
        ),
    ] = False,
) -> None:
    """Write the selected trajectories to Parquet or JSON Lines (written as they are read; replaced atomically)."""
    from distrl_stream.analysis.export import (
        SheetCounts,
        export_format,
        export_trajectories,
        images_folder,
        write_contact_sheets,
    )

    cfg = _config(config, run, bootstrap)
    selection = _selection(since, until, partition, start_offset, end_offset)
    chosen = run_command(export_format, output, fmt)
    counts = ReadCounts()
    sheets = SheetCounts()
    folder = images_folder(output)

    def write() -> int:
        with progress_bar(f"exporting {cfg.run}.trajectories") as update:
            records = read_trajectories(
                cfg.kafka, cfg.run, selection, counts=counts, progress=update, timeout_s=timeout
            )
            if images:
                records = write_contact_sheets(records, folder, sheets)
            return export_trajectories(records, output, per=per, fmt=chosen)

    rows = run_command(write)
    _warn_undecodable(counts)
    typer.echo(f"{output}: {rows} rows ({per} per row, {chosen}) from {counts.selected} trajectories")
    if images:
        typer.echo(
            f"{folder}: {sheets.episodes} contact sheets of {sheets.steps} steps, "
            f"{sheets.unreadable} screenshots missing or altered"
        )


@app.command("report")
def report(
    output: Annotated[
        Path | None,
        typer.Argument(help="Report folder (plots + summary.md).", show_default="DATA_DIR/runs/RUN/report"),
    ] = None,
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    partition: PartitionOption = None,
    start_offset: StartOffsetOption = None,
    end_offset: EndOffsetOption = None,
    timeout: TimeoutOption = 600.0,
) -> None:
    """PNG plots (success and trajectories over time, version-lag histogram, length by task) and a summary.md."""
    from distrl_stream.analysis.report import write_report

    cfg = build_config(config, run=run, data_dir=data_dir, kafka={"bootstrap_servers": bootstrap})
    selection = _selection(since, until, partition, start_offset, end_offset)
    episodes = _read_episodes(cfg, selection, timeout)
    weights = run_command(read_weight_versions, cfg.kafka, cfg.run)
    out = output or cfg.run_dir / "report"
    written = write_report(episodes, weights, out, run=cfg.run, selection=selection.describe())
    typer.echo(
        f"{written.summary}  ({written.stats.episodes} episodes, {100 * written.stats.success_rate:.1f}% success)"
    )
    for plot in written.plots:
        typer.echo(str(plot))


@app.command("learn")
def learn_from_replay(
    source: Annotated[
        str, typer.Argument(help="The recorded run whose {SOURCE}.trajectories the learner starts from.")
    ],
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    replay_updates: Annotated[int, typer.Option("--replay-updates", help="Updates of the offline phase.", min=1)] = 100,
    replay_algorithm: Annotated[
        ReplayAlgorithm,
        typer.Option(
            "--replay-algorithm",
            help="Offline update rule: bc clones every replayed episode, filtered_bc the successful ones; aride and "
            "digirl learn off-policy from the recorded behaviour log-probs.",
        ),
    ] = ReplayAlgorithm.BC,
    algorithm: Annotated[
        str | None, field_option("learner.algorithm", "--algorithm", help="The online phase's update rule.")
    ] = None,
    max_updates: Annotated[int | None, field_option("learner.max_updates", "--max-updates")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Off-to-on: pre-train a learner on a recorded run, publish the result as version 1, then learn online on --run.

    This is `distrl-stream learn --from-replay SOURCE` (the learner's own warm start), with the same options: the
    recorded trajectories are read without any consumer group, the learner then joins {run}.learner and goes on with
    the collectors' data.
    """
    cfg = _config(config, run, bootstrap)
    if cfg.run == source:
        fail(f"--run: name a new run to learn online in (offline data comes from {source})", code=2)
    learn(
        config=config,
        run=run,
        bootstrap=bootstrap,
        data_dir=data_dir,
        algorithm=algorithm,
        max_updates=max_updates,
        from_replay=source,
        replay_updates=replay_updates,
        replay_algorithm=replay_algorithm,
        verbose=verbose,
    )


@app.command("explore")
def explore(
    config: ConfigOption = None,
    run: RunOption = None,
    bootstrap: BootstrapOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to serve on. Anything but a loopback address needs --token (reach it through "
            "an SSH tunnel instead: docs/replay.md).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to serve on (0: any free one).", min=0, max=65535)] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="DISTRL_EXPLORER_TOKEN",
            help="Secret every request must carry (open the page once with ?token=TOKEN; it becomes a cookie). "
            "Required with a --host that is not a loopback address.",
            show_default="none",
        ),
    ] = None,
    index: Annotated[
        Path | None,
        typer.Option(
            "--index",
            help="The explorer's SQLite index (rebuilt from Kafka when missing or stale).",
            show_default="DATA_DIR/runs/RUN/explorer.sqlite",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """A local, read-only web app over the run: versions, a filterable episode table, each episode step by step
    (screenshots, candidates, actions, log-probs, lag, latencies), dead letters, all following the topics live.

    It reads the topics the way replay does, never through a consumer group; Ctrl-C stops it.
    """
    from distrl_stream.explorer import Explorer

    cfg = build_config(config, run=run, data_dir=data_dir, kafka={"bootstrap_servers": bootstrap})
    explorer = run_command(
        Explorer, cfg.kafka, cfg.run, index or cfg.run_dir / "explorer.sqlite", host=host, port=port, token=token
    )
    url = run_command(explorer.start)
    typer.echo(f"run {cfg.run}: {url}{'?token=…' if token else ''} (Ctrl-C stops it)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        explorer.stop()
