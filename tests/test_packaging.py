"""The wheel: built from what docker/Dockerfile copies, it holds every package, the schemas and the CLI, and works.

The installed-wheel test puts the wheel alone into a fresh virtual environment that borrows this environment's
site-packages for the dependencies through a .pth file. A .pth line only adds a folder to ``sys.path``; the .pth
files inside that folder do not run, so the checkout's editable install stays out and the wheel's copy is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What docker/Dockerfile copies into its build stage: the wheel must build from these alone.
SOURCES = ("pyproject.toml", "README.md", "distrl_stream", "cli", "schemas")

# Runs in the fresh environment: a TrajectoryEvent through the packaged schemas, and where things were loaded from.
ROUND_TRIP = textwrap.dedent(
    """
    import json
    from datetime import UTC, datetime

    import numpy as np

    import distrl_stream
    from distrl_stream.events import Step, Tensor, Termination, TrajectoryEvent, decode, encode
    from distrl_stream.events.store import DEFAULT_SCHEMA_DIR

    now = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    step = Step(
        observation="Settings", action_text='{"action_type":"click","index":1}', action="click(1)", valid=True,
        reward=1.0, done=True, behaviour_logprob=-0.5, token_ids=Tensor.from_numpy(np.arange(4, dtype=np.int32)),
        token_logprobs=Tensor.from_numpy(np.full(4, -0.125, dtype=np.float32)), policy_version=3,
        inference_latency_s=0.25, env_latency_s=0.5,
    )
    event = TrajectoryEvent(
        run="wheel", episode_id="e-1", collector_id="c-0", env_kind="sim", task_id="t-1", task_template="wifi",
        instruction="Turn Wi-Fi on", split="train", mode="async", base_model="tiny", started_at=now, ended_at=now,
        termination=Termination.SUCCESS, total_reward=1.0, success=True, steps=[step],
    )
    print(json.dumps({
        "package": distrl_stream.__file__,
        "schemas": str(DEFAULT_SCHEMA_DIR),
        "round_trip": decode(encode(event), TrajectoryEvent) == event,
    }))
    """
)


def _run(
    argv: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: setuptools comes from this environment (the machine may have no index to fetch it from).
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source])
    (built,) = out.glob("distrl_stream-*.whl")
    return built


def test_wheel_holds_every_package_the_schemas_and_the_cli(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [p.parent.relative_to(ROOT) for p in (ROOT / "distrl_stream").rglob("__init__.py")]
    missing = [str(p) for p in packages if f"{p.as_posix()}/__init__.py" not in names]
    assert not missing, f"packages left out of the wheel (add them to pyproject's packages): {missing}"
    schemas = [p.relative_to(ROOT / "schemas").as_posix() for p in (ROOT / "schemas").rglob("*") if p.is_file()]
    schemas = [s for s in schemas if "__pycache__" not in s]
    assert "ids.json" in schemas and "TrajectoryEvent.avsc" in schemas
    assert {f"distrl_stream/schemas/{s}" for s in schemas} <= names
    assert "distrl_stream/cli/main.py" in names
    assert not [n for n in names if n.startswith(("cli/", "schemas/"))], "a top-level cli or schemas package"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_the_installed_wheel_round_trips_an_event_and_runs_the_cli(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "dependencies.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    elsewhere = tmp_path / "elsewhere"  # outside the checkout: nothing importable from the working directory
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # --ignore-installed: the checkout's own install is visible through the .pth, and is not pip's to replace.
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel], env=env)

    out = json.loads(_run([python, "-c", ROUND_TRIP], cwd=elsewhere, env=env).stdout)
    assert Path(out["package"]).is_relative_to(venv), out
    assert Path(out["schemas"]).is_relative_to(venv), out
    assert out["round_trip"] is True

    help_text = _run([venv / "bin" / "distrl-stream", "--help"], cwd=elsewhere, env=env).stdout
    assert "Usage: distrl-stream" in help_text and "collect" in help_text
