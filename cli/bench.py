"""`distrl-stream bench ...`: list and run the benchmark scripts in bench/ (each writes bench/results/NAME.json,
bench/results/quick/NAME.json with --quick), and :func:`write_results`, which every script writes its result with."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from distrl_stream.cli.common import fail

app = typer.Typer(
    help="List and run the benchmarks (bench/*.py): ratios measured side by side, results in bench/results/.",
    no_args_is_help=True,
)

# The scripts live beside cli/ in a source checkout; a wheel does not ship them.
DEFAULT_BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"

BenchDirOption = Annotated[Path, typer.Option("--dir", help="Folder holding the benchmark scripts.", file_okay=False)]


def _scripts(bench_dir: Path) -> dict[str, Path]:
    if not bench_dir.is_dir():
        fail(f"no benchmark folder at {bench_dir} (benchmarks ship with a source checkout; use --dir)", code=2)
    return {p.stem: p for p in sorted(bench_dir.glob("*.py")) if not p.name.startswith("_")}


def _first_line(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def results_file(script: str | Path, *, quick: bool) -> Path:
    """Where the benchmark ``script`` (bench/NAME.py) keeps its result: bench/results/NAME.json for a full run, the
    committed file the docs cite; bench/results/quick/NAME.json (git-ignored) for ``--quick``, so that a quick check
    never overwrites a full result. A plot goes beside it, with the suffix .png."""
    script = Path(script)
    folder = script.resolve().parent / "results"
    return (folder / "quick" if quick else folder) / f"{script.stem}.json"


def write_results(script: str | Path, result: dict[str, object], *, quick: bool) -> Path:
    """Write a benchmark's result as indented JSON to :func:`results_file` and return the path."""
    path = results_file(script, quick=quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def _result(bench_dir: Path, name: str, *, quick: bool = False) -> dict[str, object] | None:
    path = results_file(bench_dir / f"{name}.py", quick=quick)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return "-" if value is None else str(value)


@app.command("list")
def list_benchmarks(bench_dir: BenchDirOption = DEFAULT_BENCH_DIR) -> None:
    """Every benchmark with what it measures and its last full result (ratio against its target)."""
    table = Table("name", "measures", "ratio", "target", "quick", title=f"benchmarks in {bench_dir}")
    for name, script in _scripts(bench_dir).items():
        result = _result(bench_dir, name) or {}
        table.add_row(
            name, _first_line(script), _fmt(result.get("ratio")), _fmt(result.get("target")), _fmt(result.get("quick"))
        )
    Console().print(table)


@app.command("run")
def run(
    names: Annotated[list[str] | None, typer.Argument(help="Benchmarks to run (see `bench list`).")] = None,
    run_all: Annotated[bool, typer.Option("--all", help="Run every benchmark.")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="The ~1 minute version of each (same measurement).")] = False,
    bench_dir: BenchDirOption = DEFAULT_BENCH_DIR,
) -> None:
    """Run benchmarks one after the other (their output streams through), then print each one's headline ratio.

    Exit code: that of the first benchmark that failed (the rest are not run).
    """
    scripts = _scripts(bench_dir)
    chosen = list(scripts) if run_all else list(names or [])
    if not chosen:
        fail("name a benchmark (see `distrl-stream bench list`) or give --all", code=2)
    unknown = [n for n in chosen if n not in scripts]
    if unknown:
        fail(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(scripts)}", code=2)
    for name in chosen:
        typer.echo(f"== {name}{' --quick' if quick else ''}", err=True)
        code = subprocess.call([sys.executable, str(scripts[name]), *(["--quick"] if quick else [])])
        if code != 0:
            fail(f"benchmark {name} failed with exit code {code}", code=code)
        result = _result(bench_dir, name, quick=quick) or {}
        typer.echo(f"{name}: ratio {_fmt(result.get('ratio'))} (target {_fmt(result.get('target'))})")
