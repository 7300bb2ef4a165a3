"""What every command shares: the --config option, config loading with one-line errors, and error exits."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from distrl_stream.config import Config, load_config
from distrl_stream.errors import ConfigError, DistrlError, KafkaAuthenticationError

err_console = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML configuration file (flags > DISTRL_* environment > file > defaults).",
        show_default="none: defaults and the environment",
    ),
]
RunOption = Annotated[
    str | None, typer.Option("--run", help="Run name; prefixes the run's topics.", show_default="demo")
]
BootstrapOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers",
        "-b",
        help="Kafka bootstrap servers (host:port,...).",
        show_default="127.0.0.1:9092, or DISTRL_KAFKA__BOOTSTRAP_SERVERS",
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one line to stderr and exit with `code` (2 for bad input, 1 for a failure at run time)."""
    # Messages quote logs and user input, whose brackets are not Rich markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
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
    """Call library code, turning a DistrlError into a one-line message and exit code 1 (2 for bad configuration or
    refused credentials: fixing the input is the only cure)."""
    try:
        return fn(*args, **kwargs)
    except (ConfigError, KafkaAuthenticationError) as exc:
        fail(str(exc), code=2)
    except DistrlError as exc:
        fail(str(exc))


class OneLineErrors(TyperGroup):
    """The root command group: a usage error (unknown option, a value of the wrong type or outside its choices)
    prints one line naming the option and what is allowed, and exits 2, like a bad configuration value does."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            # Without standalone mode click hands errors to us instead of printing its multi-line usage panel.
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.TyperException as exc:
            # Typer vendors click: its usage errors carry format_message(), exit_code (2) and the failing context.
            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            if not message:  # no arguments at all: the help was printed, nothing more to say
                sys.exit(getattr(exc, "exit_code", 2))
            err_console.print(f"[bold red]error:[/] {message}{where}", highlight=False, soft_wrap=True)
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            err_console.print("aborted", highlight=False)
            sys.exit(1)
        # Commands return None; an int here is the code of a typer.Exit raised by the command.
        sys.exit(code if isinstance(code, int) else 0)


def field_info(path: str) -> FieldInfo:
    """The declaration of a config field by its dotted path (``"inference.port"``)."""
    model: type[BaseModel] = Config
    *sections, name = path.split(".")
    for section in sections:
        annotation = model.model_fields[section].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise KeyError(f"{path}: {section} is not a config section")
        model = annotation
    return model.model_fields[name]


def field_option(path: str, *param_decls: str, help: str | None = None, **kwargs: Any) -> Any:
    """A ``typer.Option`` for the config field ``path``: its help is the field's own documentation (plus ``help``)
    and the default shown is the field's default, so ``--help`` and ``config show`` can never disagree.

    Use with a None default, so that an absent flag leaves the value to the file and the environment::

        port: Annotated[int | None, field_option("inference.port", "--port")] = None
    """
    info = field_info(path)
    text = " ".join(part for part in (info.description, help) if part)
    default = info.get_default(call_default_factory=True)
    shown = "none" if default is None else ", ".join(map(str, default)) if isinstance(default, list) else str(default)
    return typer.Option(*param_decls, help=text, show_default=shown or '""', **kwargs)


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d)$")
_UNITS = {"s": "seconds", "m": "minutes", "min": "minutes", "h": "hours", "d": "days"}


def parse_time(value: str | None, flag: str, *, now: datetime | None = None) -> datetime | None:
    """A time on the command line: ISO 8601 (naive means UTC), or an age (``90s``, ``30m``, ``2h``, ``1d`` ago).

    Raises:
        ConfigError: neither form (one line naming the flag).
    """
    if value is None:
        return None
    match = _RELATIVE.match(value.strip())
    if match:
        ago = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
        return (now or datetime.now(UTC)) - ago
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            flag, f"not a time: {value!r} (ISO 8601 like 2025-01-31T14:00, or an age: 30m, 2h, 1d)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int | None], None]]:
    """A transient rich progress bar on stderr; yields ``update(done, total)`` (total None: a counter only)."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield update
