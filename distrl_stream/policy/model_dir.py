"""The base model folder of a run: the one answer to "which model?" for the inference server and the learner.

The learner must train on exactly the base the server serves, so both resolve it here. Building the local model
needs torch and transformers, which are imported only when it is built.
"""

from __future__ import annotations

from pathlib import Path

from distrl_stream.config import Config


def resolve_model_dir(cfg: Config) -> Path:
    """The base model folder to serve: ``model.base``, or the local model of ``model.size``, built on first use."""
    if cfg.model.base is not None:
        return cfg.model.base
    target = cfg.data_dir / "models" / cfg.model.size
    if not (target / "config.json").is_file():
        from distrl_stream.policy.model import build_model  # torch + transformers: only when building

        build_model(target, cfg.model.size, seed=cfg.model.seed)
    return target
