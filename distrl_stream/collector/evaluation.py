"""Held-out evaluation: the success rate of one served policy version on a fixed set of test-split tasks.

It reuses the collector's episode loop (:func:`distrl_stream.collector.run_episode`), so an evaluated episode is
exactly a collected one (same prompts, same choice constraint, same sampling), only never published. The version is
pinned for the whole evaluation: the client reads the served versions once and never moves on, and every step records
the version that acted, which the result reports, so a version retired mid-evaluation cannot go unnoticed.

- :func:`evaluate`: the newest version the server serves now (optionally checking it is the expected one);
- :func:`evaluate_policy`: any policy that answers as the client does (a scripted or random reference);
- :class:`VersionEvaluator`: after the fact, published versions one by one, each verified and hot-loaded into a
  server of its own (ascending, so each is the newest when it is evaluated), so evaluation never competes with
  training for the CPU while the run is going.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence
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


@dataclass(frozen=True)
class EvalResult:
    """How one policy version did on a set of tasks (one episode per task).

    Attributes:
        version: the version evaluated (the one the client was pinned to).
        episodes: episodes run.
        successes: episodes that ended in success.
        by_template: template -> (successes, episodes).
        errors: episodes ended by an inference or environment error (counted as failures).
        versions_seen: every version that produced an action (just ``version`` unless it was retired mid-way).
        mean_steps: mean episode length.
    """

    version: int
    episodes: int
    successes: int
    by_template: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: int = 0
    versions_seen: tuple[int, ...] = ()
    mean_steps: float = 0.0

    @property
    def success_rate(self) -> float:
        """successes / episodes (0 when none ran)."""
        return self.successes / self.episodes if self.episodes else 0.0


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
) -> EvalResult:
    """Run each task once with the newest version the server serves, ``concurrency`` environments at a time.

    Args:
        cfg: environment, inference (mode, sampling, server address) and model (policy id) settings.
        tasks: the tasks (e.g. :func:`held_out_tasks`).
        concurrency: environments running at once.
        version: the version expected to be the newest served; None takes whatever is.
        base_url: the server; default ``cfg.inference.base_url``.

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
        return await evaluate_policy(cfg, tasks, client, concurrency=concurrency, version=served)


async def evaluate_policy(
    cfg: Config,
    tasks: Sequence[Task],
    policy: Policy,
    *,
    concurrency: int = 8,
    version: int = 0,
    prompter: Prompter | None = None,
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
                if outcome.termination is Termination.ENV_ERROR:
                    await env.close()
                    env = make_env(env_cfg)
        finally:
            await env.close()

    await asyncio.gather(*(worker(make_env(env_cfg)) for _ in range(max(1, min(concurrency, len(tasks))))))
    by_template: dict[str, tuple[int, int]] = {}
    for o in outcomes:
        won, ran = by_template.get(o.task.template, (0, 0))
        by_template[o.task.template] = (won + o.success, ran + 1)
    errors = sum(o.termination in (Termination.ENV_ERROR, Termination.INFERENCE_ERROR) for o in outcomes)
    return EvalResult(
        version=version,
        episodes=len(outcomes),
        successes=sum(o.success for o in outcomes),
        by_template=dict(sorted(by_template.items())),
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
        self, event: WeightVersionEvent | None, tasks: Sequence[Task], *, concurrency: int = 8
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
        return await evaluate(self.cfg, tasks, concurrency=concurrency, version=version, base_url=self.server_url)
