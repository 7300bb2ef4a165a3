"""`distrl-stream collect`: run K environments against the policy server and publish every finished episode."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from typing import Annotated

import typer

from distrl_stream.cli.common import (
    BootstrapOption,
    ConfigOption,
    RunOption,
    build_config,
    fail,
    field_option,
    run_command,
)


def collect(
    config: ConfigOption = None,
    run: RunOption = None,
    envs: Annotated[int | None, field_option("collector.envs", "--envs", "-k")] = None,
    mode: Annotated[str | None, field_option("collector.mode", "--mode")] = None,
    env: Annotated[
        str | None, field_option("env.kind", "--env", help="One of sim, miniwob, android, browsergym, gymnasium.")
    ] = None,
    action_mode: Annotated[str | None, field_option("inference.mode", "--action-mode")] = None,
    inference_urls: Annotated[
        list[str] | None,
        field_option(
            "inference.urls",
            "--inference-url",
            help="Repeat the flag for several servers. Absent: the config's inference.urls, else inference.url, "
            "else its host:port.",
            metavar="URL",
        ),
    ] = None,
    bootstrap: BootstrapOption = None,
    split: Annotated[str | None, field_option("collector.split", "--split")] = None,
    collector_id: Annotated[str | None, field_option("collector.collector_id", "--collector-id")] = None,
    pause_above_policy_lag: Annotated[
        int | None, field_option("collector.pause_above_policy_lag", "--pause-above-policy-lag")
    ] = None,
    grace: Annotated[float | None, field_option("collector.shutdown_grace_s", "--grace")] = None,
    episodes: Annotated[int | None, field_option("collector.max_episodes", "--episodes")] = None,
    duration: Annotated[float | None, field_option("collector.duration_s", "--duration")] = None,
    metrics_interval: Annotated[
        float | None, field_option("collector.metrics_interval_s", "--metrics-interval")
    ] = None,
    latency: Annotated[str | None, field_option("env.latency", "--latency")] = None,
    metrics_port: Annotated[int | None, field_option("collector.metrics_port", "--metrics-port", min=0)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final report as JSON instead of a line.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Collect episodes until SIGTERM/Ctrl-C (or --episodes / --duration), publishing each to {run}.trajectories.

    The first signal stops new episodes; in-flight ones get --grace seconds to finish, then are abandoned.

    Abandoned episodes are never published; a second signal abandons them at once.

    Exits 0 after flushing the producer and prints a report on stdout; logs go to stderr.
    """
    cfg = build_config(
        config,
        run=run,
        kafka={"bootstrap_servers": bootstrap},
        inference={"urls": inference_urls, "mode": action_mode},
        env={"kind": env, "latency": latency},
        collector={
            "envs": envs,
            "mode": mode,
            "split": split,
            "collector_id": collector_id,
            "pause_above_policy_lag": pause_above_policy_lag,
            "shutdown_grace_s": grace,
            "max_episodes": episodes,
            "duration_s": duration,
            "metrics_interval_s": metrics_interval,
            "metrics_port": metrics_port,
        },
    )
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # One line per HTTP request would drown the collector's own log.
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
    from distrl_stream.collector import run_collector  # keeps `--help` free of the Kafka and env imports

    report = run_command(run_collector, cfg)
    typer.echo(json.dumps(asdict(report)) if as_json else report.summary())
    if report.failure is not None:
        fail(f"collector {report.collector_id} could not collect: {report.failure}")
