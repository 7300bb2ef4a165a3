"""The base model folder of a run: the one answer to "which model?" for the inference server and the learner.

The learner must train on exactly the base the server serves, so both resolve it here. Building or pulling a
model needs torch and transformers, which are imported only then.
"""

from __future__ import annotations

from pathlib import Path

from distrl_stream.config import Config
from distrl_stream.policy.prompt import Prompter


def resolve_model_dir(cfg: Config) -> Path:
    """The base model folder to serve: ``model.base`` when it is a folder; a known pretrained model's name
    (``smollm2-135m-instruct``), pulled into data_dir/models/<name> on first use; else the local model of
    ``model.size``, built on first use."""
    base = cfg.model.base
    if base is not None:
        from distrl_stream.policy.pretrained import PRETRAINED, pull

        if not base.exists() and str(base) in PRETRAINED:
            return pull(str(base), pulled_model_dir(cfg, str(base)))
        return base
    target = cfg.data_dir / "models" / cfg.model.size
    if not (target / "config.json").is_file():
        from distrl_stream.policy.model import build_model  # torch + transformers: only when building

        build_model(target, cfg.model.size, seed=cfg.model.seed)
    return target


def pulled_model_dir(cfg: Config, name: str) -> Path:
    """Where a pretrained model pulled by name lives: data_dir/models/<name>."""
    return cfg.data_dir / "models" / name


def load_prompter(cfg: Config) -> Prompter:
    """The prompt format of the run's base model (:class:`~distrl_stream.policy.prompt.Prompter`): chat when its
    tokenizer has a chat template. The local tiny models have none, so a run without ``model.base`` renders the raw
    format without building or loading anything."""
    if cfg.model.base is None:
        return Prompter()
    from transformers import AutoTokenizer  # only for a base folder

    return Prompter(AutoTokenizer.from_pretrained(resolve_model_dir(cfg)))
