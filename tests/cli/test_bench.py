"""`distrl-stream bench`: lists the benchmark scripts and runs them by name, passing --quick through."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from distrl_stream.cli.bench import DEFAULT_BENCH_DIR
from distrl_stream.cli.main import app

runner = CliRunner()

# A stand-in benchmark following the bench/ convention: writes results/NAME.json, with --quick recorded.
SCRIPT = '''"""Counts to three, side by side with counting to one."""
import json, sys
from pathlib import Path
quick = "--quick" in sys.argv
out = Path(__file__).parent / "results" / "count.json"
out.parent.mkdir(exist_ok=True)
out.write_text(json.dumps({"name": "count", "quick": quick, "ratio": 3.0, "target": 2.0, "metrics": {}}))
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
    assert json.loads((tmp_path / "results" / "count.json").read_text())["quick"] is True


def test_a_failing_benchmark_fails_the_command(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text('"""Fails."""\nraise SystemExit(4)\n')
    result = runner.invoke(app, ["bench", "run", "--all", "--dir", str(tmp_path)])
    assert result.exit_code == 4
    assert "benchmark broken failed with exit code 4" in result.output
