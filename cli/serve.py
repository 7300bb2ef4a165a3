"""`distrl-stream serve`: the vLLM policy server, with the weight-version watcher hot-loading new LoRA versions."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from distrl_stream.cli.common import (
    BootstrapOption,
    ConfigOption,
    RunOption,
    build_config,
    err_console,
    fail,
    field_option,
    run_command,
)
from distrl_stream.processes import log_report

if TYPE_CHECKING:
    from distrl_stream.config import Config
    from distrl_stream.inference.server import InferenceServer
    from distrl_stream.inference.versions import WeightWatcher


def serve(
    config: ConfigOption = None,
    run: RunOption = None,
    model: Annotated[Path | None, field_option("model.base", "--model")] = None,
    data_dir: Annotated[Path | None, field_option("data_dir", "--data-dir")] = None,
    host: Annotated[str | None, field_option("inference.host", "--host")] = None,
    port: Annotated[int | None, field_option("inference.port", "--port", min=0, help="0: pick a free one.")] = None,
    device: Annotated[str | None, field_option("inference.device", "--device")] = None,
    watch: Annotated[bool | None, field_option("inference.watch_weights", "--watch/--no-watch")] = None,
    metrics_port: Annotated[int | None, field_option("inference.metrics_port", "--metrics-port", min=0)] = None,
    bootstrap: BootstrapOption = None,
) -> None:
    """Serve the policy with vLLM (OpenAI API) until interrupted; new weight versions are loaded as they appear."""
    overrides: dict[str, Any] = {
        "run": run,
        "data_dir": data_dir,
        "kafka": {"bootstrap_servers": bootstrap},
        "model": {"base": model},
        "inference": {
            "host": host,
            "port": port,
            "device": device,
            "watch_weights": watch,
            "metrics_port": metrics_port,
        },
    }
    cfg = build_config(config, **overrides)
    from distrl_stream.inference.server import InferenceServer  # keeps `--help` free of heavy imports

    server: InferenceServer = run_command(InferenceServer.from_config, cfg)
    # SIGTERM (docker stop, kill, `up`) stops vLLM's process group just as Ctrl-C does, a (re)start in progress too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    err_console.print(f"starting vLLM ({server.device}), log {server.log_path}", highlight=False)
    watcher: WeightWatcher | None = None
    try:
        run_command(server.start)
        watcher = run_command(_start_watcher, cfg, server)
        if watcher is not None:  # a restart's watcher serves its metrics where this one does (a port 0 was chosen)
            cfg = cfg.model_copy(
                update={"inference": cfg.inference.model_copy(update={"metrics_port": watcher.prometheus.port})}
            )
        err_console.print(f"serving {server.base_name} from {server.model_dir} on {server.url}", highlight=False)
        shown, refused, restarts = 0, 0, 0
        while True:
            time.sleep(1.0)
            if not server.running():
                exited = f"vLLM server exited unexpectedly with code {server.returncode}"
                if restarts >= cfg.inference.restarts:
                    fail(
                        f"{exited} after {restarts} restarts "
                        f"(inference.restarts = {cfg.inference.restarts}) {log_report(server.log_path)}"
                    )
                restarts += 1
                # The requests in flight died with its engine: clients move them to another server (docs/inference.md).
                err_console.print(
                    f"{exited}; restarting it ({restarts} of {cfg.inference.restarts}) {log_report(server.log_path)}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
                if watcher is not None:
                    # The adapters it loaded died with the engine: a new watcher loads the newest version again.
                    watcher.stop()
                    watcher = None
                server.stop()
                run_command(server.start)  # one that is not ready in time fails `serve`, restarts left or not
                watcher, shown, refused = run_command(_start_watcher, cfg, server), 0, 0
                err_console.print(f"serving {server.base_name} again on {server.url}", highlight=False)
                continue
            if watcher is None:
                continue
            if watcher.failed is not None:
                fail(f"weight watcher stopped: {watcher.failed}")
            if watcher.newest_version != shown:
                shown = watcher.newest_version
                err_console.print(f"now serving {cfg.model.policy_id}-v{shown}", highlight=False)
            for version, reason in watcher.refused[refused:]:
                err_console.print(f"[bold red]refused[/] version {version}: {reason}", highlight=False)
            refused = len(watcher.refused)
    except KeyboardInterrupt:
        pass
    finally:
        if watcher is not None:
            watcher.stop()
        server.stop()
        if watcher is not None:
            watcher.loader.clear_staging()  # vLLM is gone: nothing can reload a staged copy now
        err_console.print("server stopped", highlight=False)


def _start_watcher(cfg: Config, server: InferenceServer) -> WeightWatcher | None:
    """The weight watcher of a (re)started server, or None without ``inference.watch_weights``."""
    if not cfg.inference.watch_weights:
        return None
    from distrl_stream.inference.versions import WeightWatcher

    watcher = WeightWatcher(cfg, server_url=server.url, model_dir=server.model_dir)
    # The staging folder is this server's: what a killed predecessor left there is never loaded again.
    watcher.loader.clear_staging()
    watcher.start()
    return watcher
