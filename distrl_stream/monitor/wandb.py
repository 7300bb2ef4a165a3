"""Optional Weights & Biases tracking (``monitor.wandb_project``), for those who read their runs there.

Each process that tracks (the learner's writer, every collector, ``up``'s held-out evaluations) is one W&B run,
named ``<run>-<source>`` with the role as its job type, and grouped by the run name, so one run here is one W&B group.
The ``wandb`` package is an optional extra (``pip install 'distrl-stream[wandb]'``). In offline mode (no network) W&B
writes the run under ``monitor.wandb_dir`` for a later ``wandb sync``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distrl_stream.config import Config
from distrl_stream.errors import ConfigError


class Tracker:
    """One W&B run: values logged as ``<prefix>/<name>``, at a step or at W&B's own next step.

    Args:
        run: a ``wandb`` run.
    """

    def __init__(self, run: Any) -> None:
        self._run = run

    def log(self, prefix: str, values: Mapping[str, float], step: int | None = None) -> None:
        """One row of ``values`` (W&B keeps steps increasing: a step below the last one is dropped, with a warning)."""
        self._run.log({f"{prefix}/{name}": value for name, value in values.items()}, step=step)

    def close(self) -> None:
        """Finish the run (W&B flushes its files)."""
        self._run.finish()


def tracker(cfg: Config, role: str, source_id: str) -> Tracker | None:
    """A :class:`Tracker` for this process when ``monitor.wandb_project`` is set, else None.

    Raises:
        ConfigError: the wandb package is not installed (one line naming ``monitor.wandb_project``).
    """
    section = cfg.monitor
    if section.wandb_project is None:
        return None
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "monitor.wandb_project", "needs the wandb package: pip install 'distrl-stream[wandb]' (or unset it)"
        ) from None
    folder = section.wandb_dir or cfg.run_dir
    folder.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=section.wandb_project,
        entity=section.wandb_entity,
        group=cfg.run,
        job_type=role,
        name=f"{cfg.run}-{source_id}",
        dir=str(folder),
        mode=section.wandb_mode,
        # The whole configuration, secrets masked as pydantic prints them ("**********").
        config=cfg.model_dump(mode="json"),
        # One process may track several runs one after another (tests, benchmarks): each init is a new run.
        reinit="create_new",
    )
    return Tracker(run)
