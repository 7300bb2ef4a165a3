"""Held-out evaluation: the success rate of one served policy version on a fixed set of test-split tasks.

It reuses the collector's episode loop (:func:`distrl_stream.collector.run_episode`), so an evaluated episode is
exactly a collected one (same prompts, same choice constraint, same sampling), only never published. The version is
pinned for the whole evaluation: the client reads the served versions once and never moves on, and every step records
the version that acted, which the result reports, so a version retired mid-evaluation cannot go unnoticed.

- :func:`evaluate`: the newest version the server serves now (optionally checking it is the expected one);
- :func:`evaluate_policy`: any policy that answers as the client does (a scripted or random reference);
- :class:`VersionEvaluator`: after the fact, published versions one by one, each verified and hot-loaded into a
  server of its own (ascending, so each is the newest when it is evaluated), so evaluation never competes with
  training for the CPU while the run is going;
- :func:`evaluate_versions`: a list of those in turn (the base model, published versions, or what a server serves
  now), the one loop behind ``distrl-stream eval``, ``up``'s before/after numbers and the learning benchmarks.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from distrl_stream.collector.episode import Policy, policy_env, run_episode
from distrl_stream.config import Config
from distrl_stream.envs.base import DeviceEnv, Task
from distrl_stream.envs.factory import make_env
from distrl_stream.envs.tasks import task_pool
from distrl_stream.errors import EvaluationError
from distrl_stream.events import Termination, WeightVersionEvent
from distrl_stream.inference.client import InferenceClient
from distrl_stream.policy.model_dir import load_prompter
from distrl_stream.policy.prompt import Prompter

# z of a two-sided 95% interval: the 0.975 quantile of the standard normal.
Z_95 = 1.959963984540054


def wilson_interval(successes: int, episodes: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a success rate: the p whose normal test at ``z`` accepts ``successes`` of
    ``episodes``,

        (p̂ + z²/2n ± z √(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n),

    which, unlike p̂ ± z √(p̂(1 − p̂)/n), stays inside [0, 1] and is not empty at 0 or n successes. (0, 1) for n = 0.
    """
    if episodes == 0:
        return 0.0, 1.0
    p, n, z2 = successes / episodes, episodes, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class EvalResult:
    """How one policy version did on a set of tasks (each task as many times as it is listed).

    Attributes:
        version: the version evaluated (the one the client was pinned to).
        episodes: episodes run.
        successes: episodes that ended in success.
        by_template: template -> (successes, episodes).
        by_task: task id -> (successes, episodes).
        errors: episodes ended by an inference or environment error (counted as failures).
        versions_seen: every version that produced an action (just ``version`` unless it was retired mid-way).
        mean_steps: mean episode length.
    """

    version: int
    episodes: int
    successes: int
    by_template: dict[str, tuple[int, int]] = field(default_factory=dict)
    by_task: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: int = 0
    versions_seen: tuple[int, ...] = ()
    mean_steps: float = 0.0

    @property
    def success_rate(self) -> float:
        """successes / episodes (0 when none ran)."""
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of :attr:`success_rate` (:func:`wilson_interval`)."""
        return wilson_interval(self.successes, self.episodes)


def held_out_tasks(cfg: Config, n: int) -> list[Task]:
    """The first ``n`` test-split tasks of the configured environment (a fixed, reproducible set)."""
    return task_pool(cfg.env, "test", n)


async def evaluate(
    cfg: Config,
    tasks: Sequence[Task],
    *,
    concurrency: int = 8,
    version: int | None = None,
    base_url: str | None = None,
    on_episode: Callable[[], None] | None = None,
) -> EvalResult:
    """Run each task once with the newest version the server serves, ``concurrency`` environments at a time.

    Args:
        cfg: environment, inference (mode, sampling, server address) and model (policy id) settings.
        tasks: the tasks (e.g. :func:`held_out_tasks`).
        concurrency: environments running at once.
        version: the version expected to be the newest served; None takes whatever is.
        base_url: the server; default ``cfg.inference.base_url``.
        on_episode: called after each episode (a progress bar).

    Raises:
        EvaluationError: the server does not serve ``version`` as its newest.
        InferenceError: the server cannot be reached.
    """
    # An infinite poll interval pins the client to what refresh_versions() read.
    pinned = cfg.inference.model_copy(update={"version_poll_s": math.inf})
    async with InferenceClient(pinned, cfg.model.policy_id, base_url=base_url) as client:
        served = await client.refresh_versions()
        if version is not None and served != version:
            raise EvaluationError(f"expected version {version} to be served as the newest, the server has {served}")
        return await evaluate_policy(cfg, tasks, client, concurrency=concurrency, version=served, on_episode=on_episode)


async def evaluate_policy(
    cfg: Config,
    tasks: Sequence[Task],
    policy: Policy,
    *,
    concurrency: int = 8,
    version: int = 0,
    prompter: Prompter | None = None,
    on_episode: Callable[[], None] | None = None,
) -> EvalResult:
    """Run each task once with ``policy`` (anything that answers ``act`` as the client does), as :func:`evaluate`.

    Args:
        cfg: environment and inference mode settings.
        tasks: the tasks.
        policy: the actor: a pinned client, or a scripted/random reference
            (:class:`~distrl_stream.testing.scripted.ScriptedPolicy`).
        concurrency: environments running at once.
        version: the version reported in the result.
        prompter: the prompt format; default the base model's (:func:`load_prompter`).
        on_episode: called after each episode.
    """
    queue: asyncio.Queue[Task] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    outcomes = []
    prompter = prompter or load_prompter(cfg)
    env_cfg = policy_env(cfg.env, prompter)

    async def worker(env: DeviceEnv) -> None:
        try:
            while not queue.empty():
                task = queue.get_nowait()
                outcome = await run_episode(
                    env, task, policy, cfg.inference.mode, episode_id=uuid.uuid4().hex, prompter=prompter
                )
                outcomes.append(outcome)
                if on_episode is not None:
                    on_episode()
                if outcome.termination is Termination.ENV_ERROR:
                    await env.close()
                    env = make_env(env_cfg)
        finally:
            await env.close()

    await asyncio.gather(*(worker(make_env(env_cfg)) for _ in range(max(1, min(concurrency, len(tasks))))))
    by_template: dict[str, tuple[int, int]] = {}
    by_task: dict[str, tuple[int, int]] = {}
    for o in outcomes:
        for counts, key in ((by_template, o.task.template), (by_task, o.task.id)):
            won, ran = counts.get(key, (0, 0))
            counts[key] = (won + o.success, ran + 1)
    errors = sum(o.termination in (Termination.ENV_ERROR, Termination.INFERENCE_ERROR) for o in outcomes)
    return EvalResult(
        version=version,
        episodes=len(outcomes),
        successes=sum(o.success for o in outcomes),
        by_template=dict(sorted(by_template.items())),
        by_task=dict(sorted(by_task.items())),
        errors=errors,
        versions_seen=tuple(sorted({s.policy_version for o in outcomes for s in o.steps})),
        mean_steps=sum(len(o.steps) for o in outcomes) / max(len(outcomes), 1),
    )


class VersionEvaluator:
    """Evaluates published versions after the fact on a server that serves nothing else of this policy.

    Versions must be given in ascending order: each is verified (sha256) and hot-loaded with the inference
    service's own loader, becomes the newest served version, and is evaluated; older ones are unloaded.

    Args:
        cfg: as for :func:`evaluate`.
        server_url: the evaluation server (``http://host:port``).
        staging_dir: where the loader keeps its verified copies of the adapters.
    """

    def __init__(self, cfg: Config, server_url: str, staging_dir: Path) -> None:
        from distrl_stream.artifacts.transport import AdapterSource
        from distrl_stream.inference.versions import AdapterLoader

        self.cfg = cfg
        self.server_url = server_url
        self.loader = AdapterLoader(
            server_url,
            cfg.model.policy_id,
            keep_versions=1,
            staging_dir=staging_dir,
            api_key=cfg.inference.api_key,
            kafka=cfg.kafka,
            fetch_timeout_s=cfg.artifacts.fetch_timeout_s,
            source=AdapterSource.of(cfg),
            storage_options=cfg.artifacts.storage_options_values(),
        )

    async def evaluate(
        self,
        event: WeightVersionEvent | None,
        tasks: Sequence[Task],
        *,
        concurrency: int = 8,
        on_episode: Callable[[], None] | None = None,
    ) -> EvalResult:
        """Load ``event``'s version (None: evaluate what is served, e.g. version 0 before any load) and evaluate it.

        Raises:
            EvaluationError: the version is not newer than the last one evaluated.
            AdapterVerificationError: its adapter does not match the event.
        """
        version = None
        if event is not None:
            report = await asyncio.to_thread(self.loader.load, event)
            if report is None:
                newest = self.loader.newest
                raise EvaluationError(f"version {event.version} is not newer than {newest}: evaluate in order")
            version = event.version
        return await evaluate(
            self.cfg, tasks, concurrency=concurrency, version=version, base_url=self.server_url, on_episode=on_episode
        )


# What :func:`evaluate_versions` evaluates in turn: a published version (verified and hot-loaded first), the version
# expected to be the newest served already (0: the base model, before any load), or None: whatever the server serves
# newest now.
Target = WeightVersionEvent | int | None


async def evaluate_versions(
    cfg: Config,
    server_url: str,
    targets: Sequence[Target],
    tasks: Sequence[Task],
    *,
    staging_dir: Path | None = None,
    concurrency: int = 8,
    on_episode: Callable[[], None] | None = None,
    on_result: Callable[[EvalResult], None] | None = None,
) -> list[EvalResult]:
    """Evaluate each target in turn on the server at ``server_url``, every one on the same ``tasks``.

    Published versions go through :class:`VersionEvaluator` (verified by sha256, hot-loaded, in ascending order, on a
    server that serves nothing else of this policy); every adapter loaded here is unloaded at the end, so the server
    serves the base model alone again. An int or None loads nothing: it measures what the server already serves (a
    run's ``serve --watch`` server, as ``up``'s before/after numbers do).

    Args:
        cfg: as for :func:`evaluate`.
        server_url: the server (``http://host:port``).
        targets: what to evaluate, in order (see :data:`Target`).
        tasks: the tasks, each run once per listing.
        staging_dir: where the loader keeps its verified copies (needed when a target is an event).
        concurrency: environments running at once.
        on_episode: called after each episode.
        on_result: called with each version's result as it is known.

    Raises:
        EvaluationError: an expected version is not the newest served, or versions are not in ascending order.
        AdapterVerificationError: a version's adapter does not match its event.
    """
    evaluator: VersionEvaluator | None = None
    results = []
    try:
        for target in targets:
            if isinstance(target, WeightVersionEvent):
                if evaluator is None:
                    if staging_dir is None:
                        raise ValueError("evaluate_versions: published versions need a staging_dir")
                    evaluator = VersionEvaluator(cfg, server_url, staging_dir)
                result = await evaluator.evaluate(target, tasks, concurrency=concurrency, on_episode=on_episode)
            else:
                result = await evaluate(
                    cfg, tasks, concurrency=concurrency, version=target, base_url=server_url, on_episode=on_episode
                )
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        if evaluator is not None:
            from distrl_stream.inference.server import unload_all_adapters  # it imports torch: only when needed

            await asyncio.to_thread(unload_all_adapters, server_url, api_key=cfg.inference.api_key)
    return results
