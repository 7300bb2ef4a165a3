"""`distrl-stream up`: a whole learning run on this machine (broker, model, vLLM, learner, collectors, monitor)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from distrl_stream.cli.common import ConfigOption, RunOption, build_config, field_option, run_command


def up(
    config: ConfigOption = None,
    run: RunOption = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            help="Seconds to run once everything is up, then stop in order (0: until Ctrl-C).",
            min=0,
            show_default="until Ctrl-C",
        ),
    ] = None,
    collectors: Annotated[int, typer.Option("--collectors", "-n", help="Collector processes.", min=1)] = 2,
    envs_per_collector: Annotated[int | None, field_option("collector.envs", "--envs-per-collector", min=1)] = None,
    env: Annotated[
        str | None, field_option("env.kind", "--env", help="One of sim, miniwob, android, browsergym, gymnasium.")
    ] = None,
    mode: Annotated[str | None, field_option("collector.mode", "--mode", help="async or sync.")] = None,
    action_mode: Annotated[str | None, field_option("inference.mode", "--action-mode")] = None,
    algorithm: Annotated[str | None, field_option("learner.algorithm", "--algorithm")] = None,
    pause_above_policy_lag: Annotated[
        int | None, field_option("collector.pause_above_policy_lag", "--pause-above-policy-lag")
    ] = None,
    drop_above_policy_lag: Annotated[
        int | None, field_option("learner.drop_above_policy_lag", "--drop-above-policy-lag")
    ] = None,
    latency: Annotated[str | None, field_option("env.latency", "--latency")] = None,
    model: Annotated[Path | None, field_option("model.base", "--model")] = None,
    size: Annotated[str | None, field_option("model.size", "--size")] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-servers",
            "-b",
            help="Use this Kafka cluster instead of starting the embedded broker.",
            show_default="the embedded broker in DATA_DIR/kafka, on port 9092 when free",
        ),
    ] = None,
    keep_broker: Annotated[
        bool, typer.Option("--keep-broker", help="Leave the embedded broker running afterwards (for replays).")
    ] = False,
    monitor: Annotated[
        bool, typer.Option("--monitor/--no-monitor", help="Show the live dashboard while the run goes.")
    ] = True,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Write the replay report (plots) when the run ends.")
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            help="Serve up's own Prometheus metrics on this port (0: a free one) and give every child a free metrics "
            "port of its own; the scrape targets are printed and written to RUN_DIR/prometheus-targets.json.",
            show_default="none: no metrics",
        ),
    ] = None,
    startup_timeout: Annotated[
        float | None, field_option("inference.startup_timeout_s", "--startup-timeout", min=1)
    ] = None,
) -> None:
    """Run a whole learning run on this machine: Kafka, model, vLLM, learner, collectors and the live monitor.

    Starts the embedded Kafka broker, builds the tiny policy model if none is configured, starts the vLLM server
    with its weight watcher, the learner and N collectors, and shows the monitor.

    Ctrl-C (or the end of --duration, or SIGTERM) stops everything in order: collectors, learner (final checkpoint),
    server, broker; then prints a summary. Child processes never outlive it. Exit code 1 if a role died.
    """
    flags: dict[str, Any] = {
        "data_dir": data_dir,
        "env": {"kind": env, "latency": latency},
        "collector": {"envs": envs_per_collector, "mode": mode, "pause_above_policy_lag": pause_above_policy_lag},
        "inference": {"mode": action_mode, "startup_timeout_s": startup_timeout},
        "learner": {"algorithm": algorithm, "drop_above_policy_lag": drop_above_policy_lag},
        "model": {"base": model, "size": size},
    }
    cfg = build_config(config, run=run, kafka={"bootstrap_servers": bootstrap}, **flags)
    from distrl_stream.cli.up_ui import run_up  # process management and Kafka: not for --help
    from distrl_stream.envs.tasks import task_pool
    from distrl_stream.orchestrate import UP_EVAL_TASKS, UpOptions, up_profile, uses_external_kafka
    from distrl_stream.policy.model_dir import load_prompter

    # A base whose tokenizer has a chat template is a pretrained model: its own profile (docs/cli.md). The local
    # vision model (model.size tiny-vl) has one too, for its image part, but the tiny model's size: the tiny profile.
    prompter = run_command(load_prompter, cfg)
    pretrained = prompter.format == "chat" and (cfg.model.base is not None or not prompter.vision)
    profile = up_profile(cfg, pretrained=pretrained, vision=prompter.vision)
    if profile:
        # Passed on like flags, so every child (and the evaluation) sees the same values.
        for section, values in profile.items():
            flags[section] = {**flags.get(section, {}), **values}
        cfg = build_config(config, run=run, kafka={"bootstrap_servers": bootstrap}, **flags)
        shown = ", ".join(f"{section}.{k}={v}" for section, values in profile.items() for k, v in values.items())
        kind = "2-core profile for pretrained models" if pretrained else "2-core profile"
        typer.echo(f"up's {kind} (set any of these to override): {shown}")

    # A task that cannot run (an unknown BrowserGym task, no chromium) fails here, before any process starts.
    run_command(task_pool, cfg.env, "train", 1)
    external = uses_external_kafka(cfg)
    options = UpOptions(
        collectors=collectors,
        config_path=config.resolve() if config else None,
        external_kafka=external,
        keep_broker=keep_broker,
        # The server's own deadline (same setting) fails first, with vLLM's log: this one is only a backstop.
        startup_timeout_s=cfg.inference.startup_timeout_s + 60.0,
        collector_stop_s=cfg.collector.shutdown_grace_s + cfg.collector.flush_timeout_s + 15.0,
        metrics_port=metrics_port,
        eval_tasks=UP_EVAL_TASKS,
    )
    summary = run_up(cfg, options, _environment(flags), duration_s=duration or None, monitor=monitor, report=report)
    typer.echo(_summary_text(summary, keep_broker=keep_broker, external=external))
    if summary.failure:
        raise typer.Exit(1)


def _environment(flags: dict[str, Any], prefix: str = "DISTRL_") -> dict[str, str]:
    """The flags that were given, as the DISTRL_* variables that make every child see the same values."""
    out: dict[str, str] = {}
    for key, value in flags.items():
        name = f"{prefix}{key.upper()}"
        if isinstance(value, dict):
            out.update(_environment(value, name + "__"))
        elif isinstance(value, Path):
            out[name] = str(value.resolve())
        elif isinstance(value, list | bool):
            out[name] = json.dumps(value)  # pydantic-settings reads complex values from the environment as JSON
        elif value is not None:
            out[name] = str(value)
    return out


def _held_out(result: dict[str, float] | None) -> str:
    if result is None:
        return "not measured"
    interval = f"95% {100 * result['ci_low']:.1f}-{100 * result['ci_high']:.1f}%, " if "ci_low" in result else ""
    return f"{100 * result['success']:.1f}% ({interval}v{int(result['version'])}, {int(result['tasks'])} test tasks)"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _summary_text(s: Any, *, keep_broker: bool, external: bool) -> str:
    served = version_ranges(s.versions_served)
    lines = [
        f"run {s.run} {'FAILED' if s.failure else 'stopped'} after {s.ran_s:.0f} s",
        f"  trajectories: {s.episodes} (success {100 * s.success_rate:.1f}%, {s.trajectories_per_min:.1f}/min)",
        f"  weight versions: {s.versions_published} published, {len(s.versions_served)} served ({served})",
        f"  learner updates: {'-' if s.learner_updates is None else s.learner_updates}",
        f"  pacing: collectors paused {_share(s.collectors_paused_share)} of their time, learner idle "
        f"{_share(s.learner_idle_share)} of its",
        f"  prompt ids: {'-' if s.prompt_ids_checked is None else s.prompt_ids_checked} steps trained on the "
        f"server's, {'-' if s.prompt_ids_mismatched is None else s.prompt_ids_mismatched} of them unlike the "
        "learner's own rendering",
        f"  held-out success: {_held_out(s.held_out_start)} before training, {_held_out(s.held_out_end)} at the end",
        f"  dead letters: {s.dead_letters}",
        f"  data: {s.data_dir} (run files {s.run_dir}, logs {s.logs_dir}"
        + (f", broker {s.broker_dir})" if s.broker_dir else ")"),
    ]
    if s.report_dir:
        lines.append(f"  report: {s.report_dir}/summary.md and 4 plots")
    for name, code in s.exit_codes.items():
        if code not in (0, None):
            lines.append(f"  {name} exited with code {code}")
    if s.failure:
        lines.append("failure: " + s.failure)
    flags = f" --run {s.run}" + (
        f" -b {s.bootstrap_servers}" if external or not s.bootstrap_servers.endswith(":9092") else ""
    )
    lines.append("next:")
    if s.broker_dir and not keep_broker:
        lines.append(
            f"  distrl-stream kafka start --data-dir {Path(s.broker_dir).parent}   # the broker again, same address"
        )
    lines.append(f"  distrl-stream monitor{flags} --once")
    lines.append(f"  distrl-stream replay report{flags}")
    return "\n".join(lines)


def version_ranges(versions: Iterable[int]) -> str:
    """Versions as runs of consecutive numbers: ``v1-v44``, or ``v1-v3, v5`` when one is missing; ``none``."""
    runs: list[list[int]] = []
    for v in sorted(set(versions)):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"v{r[0]}" if len(r) == 1 else f"v{r[0]}-v{r[-1]}" for r in runs) or "none"
