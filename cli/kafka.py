"""`distrl-stream kafka ...`: run the embedded single-node broker, and install Apache Kafka for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from distrl_stream.cli.common import ConfigOption, build_config, run_command
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.install import (
    APACHE_MIRRORS,
    DEFAULT_KAFKA_VERSION,
    install_kafka,
    kafka_cache_dir,
    kafka_record_file,
    record_kafka_home,
)

app = typer.Typer(
    help="Run the embedded single-node Kafka broker (KRaft) that a one-machine setup uses.", no_args_is_help=True
)

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data folder; the broker lives in DATA_DIR/kafka (config, data, logs, state).",
        show_default="distrl-data",
    ),
]


def _broker(config: Path | None, data_dir: Path | None, **broker: object) -> EmbeddedBroker:
    cfg = build_config(config, data_dir=data_dir, broker=broker)
    return EmbeddedBroker.from_config(cfg)


@app.command("start")
def start(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", help="Client port.", show_default="a free one, kept across restarts while it stays free", min=0
        ),
    ] = None,
    heap_mb: Annotated[
        int | None, typer.Option("--heap-mb", help="JVM heap in MB.", show_default="512", min=128)
    ] = None,
    kafka_home: Annotated[
        Path | None,
        typer.Option(
            "--kafka-home",
            help="Apache Kafka installation.",
            show_default="$KAFKA_HOME, then the one `kafka use` recorded, then `kafka install`'s cache",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds to wait for the broker to answer.", show_default="60")
    ] = None,
) -> None:
    """Start the broker in the background (formatting its storage on first use) and wait until it answers.

    Prints the bootstrap address; data persists in DATA_DIR/kafka across restarts. Does nothing if it already runs.
    """
    broker = _broker(config, data_dir, port=port, heap_mb=heap_mb, kafka_home=kafka_home, startup_timeout_s=timeout)
    bootstrap = run_command(broker.start, detach=True)
    typer.echo(f"Kafka broker running at {bootstrap} (data in {broker.run_dir})")
    typer.echo(f"export DISTRL_KAFKA__BOOTSTRAP_SERVERS={bootstrap}")


@app.command("stop")
def stop(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for a clean shutdown before SIGKILL.")
    ] = 30.0,
) -> None:
    """Stop the broker (SIGTERM: a clean shutdown keeps all committed data). Does nothing if it is not running."""
    broker = _broker(config, data_dir)
    if run_command(broker.stop, timeout):
        typer.echo(f"Kafka broker in {broker.run_dir} stopped")
    else:
        typer.echo(f"no Kafka broker running in {broker.run_dir}")


@app.command("status")
def status(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Show whether the broker runs, where, and with which installation. Exit code 0 if running, 3 if not."""
    broker = _broker(config, data_dir)
    st = run_command(broker.status)
    if as_json:
        state = st.state
        typer.echo(
            json.dumps(
                {
                    "running": st.running,
                    "run_dir": str(st.run_dir),
                    "bootstrap_servers": st.bootstrap_servers,
                    "pid": state.pid if state else None,
                    "cluster_id": state.cluster_id if state else None,
                    "installation": state.installation if state else None,
                    "kafka_home": state.kafka_home if state else None,
                    "started_at": state.started_at if state else None,
                    "log": str(st.log_file),
                },
                indent=2,
            )
        )
    elif st.running and st.state is not None:
        s = st.state
        typer.echo(f"running at {s.bootstrap_servers} (pid {s.pid}, {s.installation}, since {s.started_at})")
        typer.echo(f"data and logs: {st.run_dir}")
    else:
        typer.echo(f"not running (run dir {st.run_dir})")
    if not st.running:
        raise typer.Exit(3)


@app.command("install")
def install(
    version: Annotated[str, typer.Option("--version", help="Apache Kafka release to download.")] = (
        DEFAULT_KAFKA_VERSION
    ),
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="Install from a local release archive (.tgz) or an unpacked installation instead.",
            show_default="download from the mirrors",
        ),
    ] = None,
    sha512: Annotated[
        Path | None,
        typer.Option(
            "--sha512", help="Checksum file for --from ARCHIVE.", show_default="ARCHIVE.sha512 beside it, if present"
        ),
    ] = None,
    mirror: Annotated[
        list[str] | None,
        typer.Option(
            "--mirror",
            help="Base URL serving VERSION/kafka_2.13-VERSION.tgz and .sha512; repeatable, tried in order.",
            show_default=", ".join(APACHE_MIRRORS),
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="Install location.", show_default=str(kafka_cache_dir()))
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing installation of the release.")] = False,
) -> None:
    """Install Apache Kafka into a user cache (downloads are verified against the release's SHA-512 checksum).

    `kafka start` then finds it when KAFKA_HOME is not set. Prints the installation folder.
    """
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as bar:
        task = bar.add_task(f"Kafka {version}", total=None)
        home = run_command(
            install_kafka,
            version,
            source=source,
            checksum=sha512,
            mirrors=mirror or APACHE_MIRRORS,
            cache=cache_dir,
            force=force,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    typer.echo(f"Apache Kafka installed in {home}")
    typer.echo(f"export KAFKA_HOME={home}")


@app.command("use")
def use(
    kafka_home: Annotated[Path, typer.Argument(help="An Apache Kafka installation (a folder with libs/*.jar).")],
) -> None:
    """Record KAFKA_HOME as this environment's Kafka installation (`make setup` does it with the one it used).

    Every command then finds it when KAFKA_HOME is not set; broker.kafka_home and KAFKA_HOME still win.
    """
    home = run_command(record_kafka_home, kafka_home)
    typer.echo(f"Apache Kafka at {home} recorded in {kafka_record_file()}")
