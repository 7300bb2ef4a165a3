"""bench/learning.py's plot of one seed's run: which methods share a panel (no services)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import learning

METHODS = "methods (same start)"
ABLATIONS = "A-RIDE: ablations and variants"


@pytest.mark.parametrize(
    ("methods", "panels"),
    [
        (["aride_async"], {METHODS: ["aride_async"]}),
        (["digirl_async", "filtered_bc_async"], {METHODS: ["digirl_async", "filtered_bc_async"]}),
        (
            ["aride_async", "digirl_sync", "aride_no_dper"],
            {METHODS: ["aride_async", "digirl_sync"], ABLATIONS: ["aride_async", "aride_no_dper"]},
        ),
        (["aride_no_dper"], {ABLATIONS: ["aride_no_dper"]}),
    ],
    ids=str,
)
def test_the_ablations_panel_is_drawn_only_when_an_ablation_or_variant_ran(
    methods: list[str], panels: dict[str, list[str]]
) -> None:
    assert learning.plot_panels(methods) == panels


def test_a_one_method_run_is_plotted_in_one_panel(tmp_path: Path) -> None:
    path = tmp_path / "run.png"
    curve = [{"version": 0, "seconds": 0.0, "success": 0.4}, {"version": 1, "seconds": 60.0, "success": 0.5}]
    learning.plot({"aride_async": curve}, 0.4, 0.55, 120.0, "MiniWoB++", path)
    assert path.stat().st_size > 0
