"""Entry point: `distrl-stream COMMAND`. Each command group lives in its own module beside this one."""

from __future__ import annotations

import json

import typer

from distrl_stream.cli.bench import app as bench_app
from distrl_stream.cli.collect import collect
from distrl_stream.cli.common import ConfigOption, OneLineErrors, RunOption, build_config
from distrl_stream.cli.envs import app as envs_app
from distrl_stream.cli.evaluate import evaluate
from distrl_stream.cli.kafka import app as kafka_app
from distrl_stream.cli.learn import learn
from distrl_stream.cli.model import app as model_app
from distrl_stream.cli.monitor import monitor
from distrl_stream.cli.replay import app as replay_app
from distrl_stream.cli.serve import serve
from distrl_stream.cli.topics import app as topics_app
from distrl_stream.cli.up import up

app = typer.Typer(
    name="distrl-stream",
    cls=OneLineErrors,
    rich_markup_mode="markdown",
    help="Asynchronous distributed RL for device-control agents (DistRL / A-RIDE) on Apache Kafka and vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Registration order is the order `--help` lists them in: the front door first, housekeeping last.
app.command("up")(up)
app.command("monitor")(monitor)
app.add_typer(replay_app, name="replay")
app.command("serve")(serve)
app.command("collect")(collect)
app.command("learn")(learn)
app.command("eval")(evaluate)
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")
app.add_typer(model_app, name="model")
app.add_typer(envs_app, name="envs")
app.add_typer(bench_app, name="bench")
config_app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: ConfigOption = None, run: RunOption = None) -> None:
    """Print the effective configuration (defaults < file < DISTRL_* environment < flags) as JSON."""
    cfg = build_config(config, run=run)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))
