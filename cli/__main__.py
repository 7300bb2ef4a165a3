"""`python -m distrl_stream.cli ...`: the CLI without the console script (how `up` starts its children)."""

from distrl_stream.cli.main import app

app(prog_name="distrl-stream")
