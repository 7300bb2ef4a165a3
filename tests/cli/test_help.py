"""Every command's --help works and explains every option and its default."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from distrl_stream.cli.main import app

runner = CliRunner()
ROOT = typer.main.get_command(app)
FRONT_DOOR = ["up", "kafka", "serve", "collect", "monitor", "replay", "topics", "model", "bench", "config"]


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")  # typer vendors click: duck-type its Group


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    if _is_group(group):
        for name, sub in sorted(group.commands.items()):
            found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(ROOT)


def test_the_issue_s_subcommands_all_exist() -> None:
    assert _is_group(ROOT)
    missing = [name for name in FRONT_DOOR if name not in ROOT.commands]
    assert not missing, f"missing commands: {missing}"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "root")
def test_help_exits_0_and_says_what_the_command_does(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    command = dict(COMMANDS)[path]
    assert command.help or command.short_help, f"{' '.join(path)} has no description"


@pytest.mark.parametrize("path", [p for p, c in COMMANDS if not _is_group(c)], ids=lambda p: " ".join(p))
def test_every_option_has_help_and_a_visible_default(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        flag = "/".join(param.opts)
        assert param.help and param.help.strip(), f"{' '.join(path)} {flag}: no help text"
        if param.is_flag or param.required or param.multiple:
            continue
        # A default is shown either from the value itself or from a show_default text ("until Ctrl-C", a config
        # field's default...). A None default with nothing shown would leave the user guessing.
        assert param.show_default not in (False, None) and (
            isinstance(param.show_default, str) or param.default is not None
        ), f"{' '.join(path)} {flag}: default not shown"
