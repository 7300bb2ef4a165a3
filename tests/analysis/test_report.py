"""`replay report`: plots and the Markdown summary."""

from __future__ import annotations

import random
from pathlib import Path

from distrl_stream.analysis.replay import EpisodeSummary
from distrl_stream.analysis.report import PLOTS, write_report
from tests.analysis.helpers import make_record, make_weights

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_writes_every_plot_and_a_summary_with_the_numbers(tmp_path: Path) -> None:
    rng = random.Random(11)
    episodes = [
        EpisodeSummary.from_record(
            make_record(
                rng, offset=i, ended_min=i / 2, versions=[i // 10] * 3, success=i % 4 == 0, template=f"t{i % 3}"
            )
        )
        for i in range(40)
    ]
    report = write_report(episodes, make_weights(rng, {1: 4.0, 2: 9.0}), tmp_path / "report", run="exp")
    assert [p.name for p in report.plots] == list(PLOTS)
    for plot in report.plots:
        assert plot.read_bytes()[:8] == PNG_MAGIC
    summary = report.summary.read_text()
    assert "| success rate | 25.0% |" in summary
    assert "| t0 | 14 |" in summary
    assert all(f"({name})" in summary for name in PLOTS)


def test_report_of_an_empty_selection_still_writes_its_files(tmp_path: Path) -> None:
    report = write_report([], [], tmp_path, run="empty")
    assert all(p.is_file() for p in report.plots)
    assert "No trajectories" in report.summary.read_text()
