"""The base model folder of a run: the one answer to "which model?" for the inference server and the learner.

The learner must train on exactly the base the server serves, so both resolve it here. Building or pulling a
model needs torch and transformers, which are imported only then.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path

from distrl_stream.config import Config
from distrl_stream.errors import ConfigError
from distrl_stream.policy.prompt import Prompter
from distrl_stream.policy.vision import VISION_SPECS, is_vision_model, load_processor

# A Hugging Face hub repository id, "owner/name".
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_model_dir(cfg: Config) -> Path:
    """The base model folder to serve: ``model.base`` when it is a folder; a known pretrained model's name
    (``smollm2-135m-instruct``), pulled into data_dir/models/<name> on first use; else the local model of
    ``model.size``, built on first use.

    Raises:
        ConfigError: ``model.base`` is neither an existing path nor a known pretrained model's name (the message
            lists the known names, closest first).
    """
    base = cfg.model.base
    if base is not None:
        from distrl_stream.policy.pretrained import PRETRAINED, pull

        if base.exists():
            return base
        if str(base) in PRETRAINED:
            return pull(str(base), pulled_model_dir(cfg, str(base)))
        # Checked here, before any loader sees it: transformers would take the name for a hub id and retry the
        # hub for about a minute before failing with a traceback.
        raise _unknown_base(str(base), PRETRAINED)
    target = cfg.data_dir / "models" / cfg.model.size
    if not (target / "config.json").is_file():
        from distrl_stream.policy.model import build_model  # torch + transformers: only when building

        build_model(target, cfg.model.size, seed=cfg.model.seed)
    return target


def _unknown_base(base: str, known: Iterable[str]) -> ConfigError:
    """The one-line error for a ``model.base`` that is no path on this machine and no known pretrained model."""
    names = sorted(known, key=lambda name: -difflib.SequenceMatcher(None, base, name).ratio())
    reason = "no such folder"
    if _HUB_ID.fullmatch(base):
        # Versions carry a fingerprint of the base folder's weights, so a base is always a folder on disk.
        reason += (
            ", and as a Hugging Face hub id it cannot be loaded here, since a base is a folder and nothing is "
            f"downloaded from the hub (fetch it with `huggingface-cli download {base} --local-dir DIR` where the hub "
            "is reachable, then give DIR)"
        )
    return ConfigError(
        "model.base",
        f"{base!r} is neither a folder nor a known pretrained model: {reason}; known, closest first: "
        f"{', '.join(names)} (`distrl-stream model list`)",
    )


def pulled_model_dir(cfg: Config, name: str) -> Path:
    """Where a pretrained model pulled by name lives: data_dir/models/<name>."""
    return cfg.data_dir / "models" / name


def reads_screenshots(cfg: Config, model_dir: Path | None = None) -> bool:
    """Whether the run's policy is a vision policy (``model.modality``; ``auto`` looks at the base folder).

    Raises:
        ConfigError: ``model.modality = "vision"`` with a base that is not a vision-language model.
    """
    if cfg.model.modality == "text":
        return False
    if cfg.model.base is None and cfg.model.size not in VISION_SPECS:  # a local text model: nothing to build or read
        if cfg.model.modality == "vision":
            raise ConfigError("model.modality", f"vision, but model.size {cfg.model.size!r} is a text model")
        return False
    vision = is_vision_model(model_dir or resolve_model_dir(cfg))
    if cfg.model.modality == "vision" and not vision:
        raise ConfigError("model.modality", f"vision, but the base {cfg.model.base_model_id} has no vision tower")
    return vision


def load_prompter(cfg: Config) -> Prompter:
    """The prompt format of the run's base model (:class:`~distrl_stream.policy.prompt.Prompter`): chat when its
    tokenizer has a chat template, with the screenshot for a vision policy (:func:`reads_screenshots`). The local
    tiny text models have no template, so such a run renders the raw format without building or loading anything."""
    if cfg.model.base is None and not reads_screenshots(cfg):
        return Prompter()
    model_dir = resolve_model_dir(cfg)
    if reads_screenshots(cfg, model_dir):
        return Prompter(load_processor(model_dir), vision=True)
    from transformers import AutoTokenizer  # only for a base folder

    return Prompter(AutoTokenizer.from_pretrained(model_dir))
