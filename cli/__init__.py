"""The Typer application behind the `distrl-stream` command.

Commands are thin: parse, build config, call the library.
"""
