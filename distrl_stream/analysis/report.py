"""`replay report`: PNG plots of a replayed run and a short Markdown summary beside them.

Plots (time on the x axis is minutes since the first episode of the selection ended):

- ``success_over_time.png``: rolling success rate, with the weight-version publications marked;
- ``trajectories_over_time.png``: cumulative trajectories, in all and per collector;
- ``lag_histogram.png``: steps by policy-version lag (see :mod:`distrl_stream.analysis.stats`);
- ``length_by_task.png``: episode length per task, with each task's success rate.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot state, no display needed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from distrl_stream.analysis.replay import EpisodeSummary
from distrl_stream.analysis.stats import ReplayStats, compute_stats, step_lags
from distrl_stream.events import WeightVersionEvent

PLOTS = ("success_over_time.png", "trajectories_over_time.png", "lag_histogram.png", "length_by_task.png")
SUMMARY = "summary.md"


@dataclass(frozen=True)
class Report:
    """What ``write_report`` wrote."""

    directory: Path
    plots: list[Path]
    summary: Path
    stats: ReplayStats


def write_report(
    episodes: Sequence[EpisodeSummary],
    weights: Sequence[WeightVersionEvent],
    out_dir: Path,
    *,
    run: str,
    selection: str = "everything",
) -> Report:
    """Write the four plots and ``summary.md`` into ``out_dir`` (created if needed; files are replaced).

    Args:
        episodes: the replayed episodes (any order).
        weights: the run's weight versions (for lag and the version marks).
        out_dir: report folder.
        run: run name, for titles.
        selection: the replay selection in words (:meth:`ReplaySelection.describe`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = sorted(episodes, key=lambda e: e.ended_at)
    stats = compute_stats(ordered, weights)
    t0 = ordered[0].ended_at if ordered else None
    painters = (_success_over_time, _trajectories_over_time, _lag_histogram, _length_by_task)
    plots = []
    for name, paint in zip(PLOTS, painters, strict=True):
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        paint(fig, ordered, weights, t0)
        fig.suptitle(f"run {run}: {name.removesuffix('.png').replace('_', ' ')}")
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plots.append(path)
    summary = out_dir / SUMMARY
    summary.write_text(_markdown(stats, run, selection), encoding="utf-8")
    return Report(out_dir, plots, summary, stats)


def _minutes(times: Sequence[datetime], t0: datetime | None) -> np.ndarray:
    if t0 is None:
        return np.zeros(0)
    return np.array([(t - t0).total_seconds() / 60.0 for t in times])


def _success_over_time(
    fig: Figure, episodes: Sequence[EpisodeSummary], weights: Sequence[WeightVersionEvent], t0: datetime | None
) -> None:
    ax = fig.subplots()
    ax.set_xlabel("minutes")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    if not episodes:
        ax.text(0.5, 0.5, "no episodes", ha="center", transform=ax.transAxes)
        return
    x = _minutes([e.ended_at for e in episodes], t0)
    success = np.array([float(e.success) for e in episodes])
    # A window of ~5% of the episodes (at least 10) smooths noise without hiding trends in short runs.
    window = max(10, len(episodes) // 20)
    rolling = np.array([success[max(0, i - window + 1) : i + 1].mean() for i in range(len(success))])
    ax.plot(x, rolling, label=f"rolling mean over {window} episodes")
    ax.plot(x, np.cumsum(success) / np.arange(1, len(success) + 1), linestyle="--", label="cumulative")
    for w in weights:
        minute = (w.created_at - t0).total_seconds() / 60.0 if t0 else 0.0
        if 0.0 <= minute <= x[-1]:
            ax.axvline(minute, color="grey", alpha=0.3, linewidth=0.8)
    ax.legend(loc="upper left", title="grey lines: weight versions published" if weights else None)


def _trajectories_over_time(
    fig: Figure, episodes: Sequence[EpisodeSummary], _weights: Sequence[WeightVersionEvent], t0: datetime | None
) -> None:
    ax = fig.subplots()
    ax.set_xlabel("minutes")
    ax.set_ylabel("trajectories (cumulative)")
    if not episodes:
        ax.text(0.5, 0.5, "no episodes", ha="center", transform=ax.transAxes)
        return
    x = _minutes([e.ended_at for e in episodes], t0)
    ax.step(x, np.arange(1, len(episodes) + 1), where="post", label="all", linewidth=2)
    per_collector: dict[str, list[datetime]] = defaultdict(list)
    for e in episodes:
        per_collector[e.collector_id].append(e.ended_at)
    if len(per_collector) <= 16:  # beyond that the legend is noise
        for collector, times in sorted(per_collector.items()):
            ax.step(_minutes(times, t0), np.arange(1, len(times) + 1), where="post", label=collector, alpha=0.7)
    ax.legend(loc="upper left", fontsize="small")


def _lag_histogram(
    fig: Figure, episodes: Sequence[EpisodeSummary], weights: Sequence[WeightVersionEvent], _t0: datetime | None
) -> None:
    ax = fig.subplots()
    ax.set_xlabel("policy-version lag of a step (newest version − acting version)")
    ax.set_ylabel("steps")
    lags = [lag for per in step_lags(episodes, weights) for lag in per]
    if not lags:
        ax.text(0.5, 0.5, "no steps", ha="center", transform=ax.transAxes)
        return
    values, counts = np.unique(lags, return_counts=True)
    ax.bar(values, counts, width=0.8)
    ax.set_xticks(values)


def _length_by_task(
    fig: Figure, episodes: Sequence[EpisodeSummary], _weights: Sequence[WeightVersionEvent], _t0: datetime | None
) -> None:
    ax = fig.subplots()
    ax.set_xlabel("episode length (steps)")
    per_task: dict[str, list[EpisodeSummary]] = defaultdict(list)
    for e in episodes:
        per_task[e.task_template or e.task_id].append(e)
    if not per_task:
        ax.text(0.5, 0.5, "no episodes", ha="center", transform=ax.transAxes)
        return
    tasks = sorted(per_task)
    ax.boxplot([[e.length for e in per_task[t]] for t in tasks], orientation="horizontal")
    labels = [
        f"{t} ({100 * sum(e.success for e in per_task[t]) / len(per_task[t]):.0f}% of {len(per_task[t])})"
        for t in tasks
    ]
    ax.set_yticks(range(1, len(tasks) + 1), labels, fontsize="small")


def _markdown(stats: ReplayStats, run: str, selection: str) -> str:
    lines = [
        f"# Run `{run}`: replay report",
        "",
        f"Selection: {selection}.",
        "",
    ]
    if stats.episodes == 0:
        lines += ["No trajectories in the selection.", ""]
    else:
        span = f"{stats.first_at:%Y-%m-%d %H:%M:%S} to {stats.last_at:%H:%M:%S} UTC" if stats.first_at else "-"
        lines += [
            "| | |",
            "|---|---|",
            f"| episodes | {stats.episodes} ({stats.steps} steps, {stats.invalid_steps} invalid) |",
            f"| success rate | {100 * stats.success_rate:.1f}% |",
            f"| time span | {span} ({stats.span_s / 60:.1f} min) |",
            f"| throughput | {stats.trajectories_per_min:.1f} trajectories/min |",
            f"| collectors | {len(stats.by_collector)} |",
            f"| episode length | mean {stats.length.mean:.1f}, p95 {stats.length.p95:.0f}, "
            f"max {stats.length.max:.0f} |",
            f"| policy versions acting | {stats.min_policy_version} to {stats.max_policy_version} "
            f"({stats.versions_published} published versions in the weights topic) |",
            f"| version lag (steps) | mean {stats.version_lag.mean:.2f}, p95 {stats.version_lag.p95:.0f}, "
            f"max {stats.version_lag.max:.0f} |",
            f"| inference latency | p50 {1000 * stats.inference_latency_s.p50:.0f} ms, "
            f"p95 {1000 * stats.inference_latency_s.p95:.0f} ms |",
            f"| env step latency | p50 {1000 * stats.env_latency_s.p50:.0f} ms, "
            f"p95 {1000 * stats.env_latency_s.p95:.0f} ms |",
            f"| terminations | {', '.join(f'{k} {v}' for k, v in stats.terminations.items())} |",
            "",
            "## By task",
            "",
            "| task | episodes | success | mean length |",
            "|---|---:|---:|---:|",
            *(
                f"| {t.task} | {t.episodes} | {100 * t.success_rate:.0f}% | {t.mean_length:.1f} |"
                for t in stats.by_task
            ),
            "",
        ]
    lines += ["## Plots", ""] + [f"![{p.removesuffix('.png')}]({p})" for p in PLOTS] + [""]
    return "\n".join(lines)
