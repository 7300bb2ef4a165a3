"""Held-out success of a run's versions, measured and recorded: the library behind ``distrl-stream eval``.

:func:`run_evaluation` evaluates the base model, published versions, or what a server serves now
(:func:`~distrl_stream.collector.evaluation.evaluate_versions`) on N tasks of a split × episodes per task, and
publishes each version's result as a :class:`~distrl_stream.events.MetricEvent` (role ``eval``) on ``{run}.metrics``;
``up``'s before/after numbers go through it too. :func:`resolve_versions` turns ``0``, ``latest``, ``2-5`` or a list
into the run's published version events; :func:`write_report` writes the JSON and Markdown report.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from distrl_stream.analysis.replay import read_weight_versions
from distrl_stream.collector.evaluation import EvalResult, Target, evaluate_versions
from distrl_stream.config import Config
from distrl_stream.envs.base import Split, Task
from distrl_stream.envs.tasks import task_pool
from distrl_stream.errors import ConfigError
from distrl_stream.events import MetricEvent, utc_now
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.policy.pretrained import provenance

INTERVAL = "Wilson score interval, 95%"


@dataclass(frozen=True)
class EvalPlan:
    """What one evaluation runs: the first ``tasks`` tasks of ``split``, each ``episodes_per_task`` times.

    Attributes:
        split: ``test`` (held out from training) or ``train``.
        tasks: tasks of the split, the first ones of its fixed pool (the same set on every call).
        episodes_per_task: episodes of each task (a task's world is fixed; sampling makes episodes differ).
        concurrency: environments running at once.
    """

    split: Split = "test"
    tasks: int = 40
    episodes_per_task: int = 1
    concurrency: int = 8

    def task_list(self, cfg: Config) -> list[Task]:
        """Every episode's task, task by task (a task's repeats stay together)."""
        return [task for task in task_pool(cfg.env, self.split, self.tasks) for _ in range(self.episodes_per_task)]


def parse_versions(text: str, published: Sequence[int], flag: str = "--versions") -> list[int]:
    """The versions ``text`` names, ascending and without repeats: comma-separated items, each a number (0 is the
    base model), ``latest`` (the newest published) or a range ``A-B`` (both ends included; ``B`` may be ``latest``).

    Args:
        text: e.g. ``0``, ``latest``, ``2-5``, ``0,3,latest``.
        published: the versions published (0 need not be listed: the base model always exists).
        flag: the option named in errors.

    Raises:
        ConfigError: a malformed item, a range that runs backwards, or a version that was never published (one line
            naming ``flag``).
    """
    known = set(published) | {0}
    newest = max(published, default=None)
    have = f"published: {_spans(sorted(published))}" if published else "none published yet"

    def number(item: str, whole: str) -> int:
        if item == "latest":
            if newest is None:
                raise ConfigError(flag, f"{whole!r}: no version published yet, only 0 (the base model)")
            return newest
        if not item.isdigit():
            raise ConfigError(flag, f"{whole!r}: expected a version number, latest, or a range A-B (e.g. 0,2-5,latest)")
        return int(item)

    chosen: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        low_text, dash, high_text = item.partition("-")
        low = number(low_text.strip(), item)
        high = number(high_text.strip(), item) if dash else low
        if high < low:
            raise ConfigError(flag, f"{item!r}: a range runs from the lower version to the higher")
        missing = [v for v in range(low, high + 1) if v not in known]
        if missing:
            raise ConfigError(flag, f"version {_spans(missing)} was never published ({have})")
        chosen.update(range(low, high + 1))
    return sorted(chosen)


def _spans(versions: Sequence[int]) -> str:
    """Sorted versions as runs: [1, 2, 3, 5] -> "1-3, 5"."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def resolve_versions(cfg: Config, text: str, *, timeout_s: float = 60.0) -> list[Target]:
    """The targets ``text`` names (:func:`parse_versions`) for ``cfg``'s run: 0 for the base model, and for every
    other version the :class:`~distrl_stream.events.WeightVersionEvent` published (whose sha256 the loader verifies).

    Raises:
        ConfigError: no such run at the cluster (``--run``), or a bad ``text`` (``--versions``).
        KafkaClientError: the cluster did not answer.
    """
    topic = TopicNames(cfg.run).weights
    if topic not in Admin(cfg.kafka, timeout_s=timeout_s).topics():
        raise ConfigError("--run", f"no run {cfg.run!r} at {cfg.kafka.bootstrap_servers} (no topic {topic})")
    events = {
        e.version: e
        for e in read_weight_versions(cfg.kafka, cfg.run, timeout_s=timeout_s)
        if e.policy_id == cfg.model.policy_id
    }
    return [events[v] if v else 0 for v in parse_versions(text, sorted(events))]


def run_evaluation(
    cfg: Config,
    plan: EvalPlan,
    targets: Sequence[Target],
    server_url: str,
    *,
    staging_dir: Path | None = None,
    on_episode: Callable[[], None] | None = None,
) -> list[EvalResult]:
    """Evaluate ``targets`` in turn (:func:`evaluate_versions`) on ``plan``'s tasks, and publish each result on
    ``{run}.metrics`` as it is known (:func:`metric_event`).

    Raises:
        EvaluationError: an expected version is not the newest served.
        AdapterVerificationError: a version's adapter does not match its event.
        KafkaClientError: a result could not be published.
    """
    source_id = f"eval-{uuid.uuid4().hex[:8]}"
    with Producer(cfg.kafka, client_id=source_id) as producer:

        def publish(result: EvalResult) -> None:
            producer.produce_event(TopicNames(cfg.run).metrics, metric_event(cfg, plan, result, source_id))

        return asyncio.run(
            evaluate_versions(
                cfg,
                server_url,
                targets,
                plan.task_list(cfg),
                staging_dir=staging_dir,
                concurrency=plan.concurrency,
                on_episode=on_episode,
                on_result=publish,
            )
        )


def metric_event(cfg: Config, plan: EvalPlan, result: EvalResult, source_id: str) -> MetricEvent:
    """One version's result as a ``{run}.metrics`` event: role ``eval``; the version, the counts, the success rate
    and its interval, and ``successes.T`` / ``episodes.T`` for each template ``T``; the split and env as labels."""
    low, high = result.interval
    values = {
        "policy_version": float(result.version),
        "episodes": float(result.episodes),
        "successes": float(result.successes),
        "success_rate": result.success_rate,
        "ci_low": low,
        "ci_high": high,
        "tasks": float(plan.tasks),
        "episodes_per_task": float(plan.episodes_per_task),
        "errors": float(result.errors),
        "mean_steps": result.mean_steps,
    }
    for template, (won, ran) in result.by_template.items():
        values[f"successes.{template}"] = float(won)
        values[f"episodes.{template}"] = float(ran)
    labels = {"split": plan.split, "env_kind": cfg.env.kind, "policy_id": cfg.model.policy_id}
    return MetricEvent(run=cfg.run, role="eval", source_id=source_id, timestamp=utc_now(), values=values, labels=labels)


def model_name(cfg: Config) -> str:
    """The model as a report names it: a pulled pretrained model by its registry name (from the provenance its pull
    wrote), so reports from different machines agree; any other folder by its path; the local model by its size."""
    if cfg.model.base is None:
        return cfg.model.size
    pulled = provenance(cfg.model.base)
    name = pulled.get("name") if pulled is not None else None
    return name if isinstance(name, str) else str(cfg.model.base)


def report(cfg: Config, plan: EvalPlan, results: Sequence[EvalResult], server_url: str) -> dict[str, Any]:
    """The JSON report of an evaluation: what ran, and per version the counts, the rate and its interval."""
    return {
        "run": cfg.run,
        "created_at": utc_now().isoformat(),
        "env": cfg.env.kind,
        "split": plan.split,
        "tasks": plan.tasks,
        "episodes_per_task": plan.episodes_per_task,
        "model": model_name(cfg),
        "policy_id": cfg.model.policy_id,
        "server_url": server_url,
        "interval": INTERVAL,
        "results": [
            {
                "version": r.version,
                "episodes": r.episodes,
                "successes": r.successes,
                "success_rate": r.success_rate,
                "interval": list(r.interval),
                "errors": r.errors,
                "mean_steps": r.mean_steps,
                "versions_seen": list(r.versions_seen),
                "by_template": {t: {"successes": w, "episodes": n} for t, (w, n) in r.by_template.items()},
                "by_task": {t: {"successes": w, "episodes": n} for t, (w, n) in r.by_task.items()},
            }
            for r in results
        ],
    }


def default_report_path(cfg: Config, plan: EvalPlan, now: datetime | None = None) -> Path:
    """``RUN_DIR/eval/<UTC time>-<split>.json``: in the run's folder, one file per evaluation."""
    stamp = (now or utc_now()).strftime("%Y%m%dT%H%M%SZ")
    return cfg.run_dir / "eval" / f"{stamp}-{plan.split}.json"


def write_report(data: dict[str, Any], path: Path) -> tuple[Path, Path]:
    """Write ``data`` (:func:`report`) to ``path`` as JSON and beside it (``.md``) as Markdown; returns both."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    markdown = path.with_suffix(".md")
    markdown.write_text(render_markdown(data))
    return path, markdown


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: a line per version, then successes/episodes per template and per task."""
    results = data["results"]
    lines = [
        f"# Held-out evaluation of run `{data['run']}`",
        "",
        f"{data['tasks']} {data['split']}-split tasks of `{data['env']}` × {data['episodes_per_task']} episodes per "
        f"task; model `{data['model']}`; interval: {data['interval']}; {data['created_at']}.",
        "",
        "| version | success | 95% interval | successes / episodes | errors | mean steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        low, high = r["interval"]
        lines.append(
            f"| {r['version']} | {r['success_rate']:.1%} | {low:.1%} – {high:.1%} | {r['successes']} / {r['episodes']} "
            f"| {r['errors']} | {r['mean_steps']:.2f} |"
        )
    for title, key in (("template", "by_template"), ("task", "by_task")):
        names = sorted({name for r in results for name in r[key]})
        lines += ["", f"## Successes / episodes per {title}", ""]
        lines.append("| " + " | ".join([title, *(f"v{r['version']}" for r in results)]) + " |")
        lines.append("|---" * (len(results) + 1) + "|")
        for name in names:
            cells = [_count(r[key].get(name)) for r in results]
            lines.append("| " + " | ".join([f"`{name}`", *cells]) + " |")
    return "\n".join(lines) + "\n"


def _count(counts: dict[str, int] | None) -> str:
    return "–" if counts is None else f"{counts['successes']} / {counts['episodes']}"
