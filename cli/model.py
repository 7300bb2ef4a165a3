"""`distrl-stream model ...`: build local policy models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from distrl_stream.cli.common import run_command

app = typer.Typer(help="Build and inspect local policy models.", no_args_is_help=True)


@app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="Folder to write the model into (must not exist).")],
    size: Annotated[Literal["tiny", "small"], typer.Option("--size", help="Model size: tiny | small.")] = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the weight initialisation.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing folder.")] = False,
) -> None:
    """Build a Qwen2 policy and its byte-level BPE tokenizer locally (no download); transformers and vLLM load it."""
    # torch and transformers load only when a model is built, so `--help` stays fast.
    from distrl_stream.policy.model import build_model, count_parameters

    out = run_command(build_model, directory, size, seed=seed, overwrite=overwrite)
    typer.echo(f"{out}: {size} model, {count_parameters(out):,} parameters")
