"""`distrl-stream bench`: lists the benchmark scripts and runs them by name, passing --quick through."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from distrl_stream.cli.bench import DEFAULT_BENCH_DIR, results_file
from distrl_stream.cli.main import app

runner = CliRunner()

# A stand-in benchmark following the bench/ convention: writes its result with write_results, --quick recorded.
SCRIPT = '''"""Counts to three, side by side with counting to one."""
import sys
from distrl_stream.cli.bench import write_results
quick = "--quick" in sys.argv
write_results(__file__, {"name": "count", "quick": quick, "ratio": 3.0, "target": 2.0, "metrics": {}}, quick=quick)
'''


def test_list_shows_the_repository_s_benchmarks() -> None:
    result = runner.invoke(app, ["bench", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for script in DEFAULT_BENCH_DIR.glob("*.py"):
        assert script.stem in result.output


def test_run_executes_the_script_with_quick_and_reports_its_ratio(tmp_path: Path) -> None:
    (tmp_path / "count.py").write_text(SCRIPT)
    result = runner.invoke(app, ["bench", "run", "count", "--quick", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "count: ratio 3 (target 2)" in result.stdout
    assert json.loads((tmp_path / "results" / "quick" / "count.json").read_text())["quick"] is True
    assert not (tmp_path / "results" / "count.json").exists()


def test_a_quick_run_never_writes_over_a_committed_result() -> None:
    committed = subprocess.run(
        ["git", "ls-files", "--", "results"], cwd=DEFAULT_BENCH_DIR, capture_output=True, text=True, check=True
    ).stdout.split()
    assert committed, "bench/results/ holds no committed results: run this in a git checkout"
    committed_paths = {(DEFAULT_BENCH_DIR / name).resolve() for name in committed}
    for script in sorted(DEFAULT_BENCH_DIR.glob("*.py")):
        quick = results_file(script, quick=True)
        assert quick.parent == DEFAULT_BENCH_DIR.resolve() / "results" / "quick"
        assert not {quick, quick.with_suffix(".png")} & committed_paths, script.name
        ignored = subprocess.run(["git", "check-ignore", "-q", str(quick)], cwd=DEFAULT_BENCH_DIR, check=False)
        assert ignored.returncode == 0, f"{quick} is not git-ignored"
    assert results_file(DEFAULT_BENCH_DIR / "envs.py", quick=False) == DEFAULT_BENCH_DIR.resolve() / "results/envs.json"


def test_a_failing_benchmark_fails_the_command(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text('"""Fails."""\nraise SystemExit(4)\n')
    result = runner.invoke(app, ["bench", "run", "--all", "--dir", str(tmp_path)])
    assert result.exit_code == 4
    assert "benchmark broken failed with exit code 4" in result.output
