"""What every command shares: the --config option, config loading with one-line errors, and error exits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from distrl_stream.config import Config, load_config
from distrl_stream.errors import ConfigError, DistrlError

err_console = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML configuration file (flags > DISTRL_* environment > file > defaults)."),
]
RunOption = Annotated[str | None, typer.Option("--run", help="Run name; prefixes the run's topics. [default: demo]")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one line to stderr and exit with `code` (2 for bad input, 1 for a failure at run time)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def build_config(path: Path | None, **overrides: Any) -> Config:
    """Load the effective config; flags left at None do not override. A bad value exits 2 with one line."""
    try:
        return load_config(path, **_drop_unset(overrides))
    except ConfigError as exc:
        fail(str(exc), code=2)


def _drop_unset(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = _drop_unset(value)
            if value:
                out[key] = value
        elif value is not None:
            out[key] = value
    return out


def run_command(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call library code, turning a DistrlError into a one-line message and exit code 1."""
    try:
        return fn(*args, **kwargs)
    except ConfigError as exc:
        fail(str(exc), code=2)
    except DistrlError as exc:
        fail(str(exc))
