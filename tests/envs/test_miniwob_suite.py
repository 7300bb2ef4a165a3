"""The MiniWoB++ suite check: the task list, the search's verdicts on real pages, and the table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from distrl_stream.config import load_config
from distrl_stream.envs.browsergym import BrowserGymEnv
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.miniwob_suite import SuiteRow, check_suite, counts_by_reason, markdown_table, suite_tasks

SECTION = load_config().env
needs_browser = pytest.mark.skipif(
    shutil.which(SECTION.chrome_binary) is None,
    reason=f"chromium not installed at {SECTION.chrome_binary} (apt-get install chromium chromium-driver)",
)


def test_the_suite_is_every_miniwob_task_of_the_package_without_flightwob() -> None:
    names = suite_tasks()
    assert len(names) == len(set(names)) >= 100
    assert {"click-test", "choose-list", "use-slider", "enter-date"} <= set(names)
    assert not any(name.startswith("flight.") for name in names)


def test_counts_and_table_cover_every_row() -> None:
    rows = [
        SuiteRow("click-test", 1, 1, True, "", "solved in 1 steps", 1, 0.5, ('{"action_type":"click","index":0}',)),
        SuiteRow("draw-line", 0, 0, False, "unsupported", "nothing on the first screen to act on", 1, 0.2),
        SuiteRow("email-inbox", 20, 30, False, "budget", "14 screens seen, depth 1 of 3", 40, 10.0),
    ]
    assert counts_by_reason(rows) == {"reachable": 1, "unsupported": 1, "budget": 1, "error": 0}
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert table[2] == "| click-test | 1 | 1 | yes | solved in 1 steps |"
    assert table[4] == "| email-inbox | 20 | 30 | no | budget: 14 screens seen, depth 1 of 3 |"


@pytest.mark.browser
@needs_browser
async def test_search_finds_a_two_step_solution_and_reports_budget_and_unknown_tasks() -> None:
    seen: list[tuple[str, int, int]] = []
    rows = await check_suite(
        ["choose-list", "text-transform", "no-such-task"],
        budget_s=8.0,
        progress=lambda row, done, total: seen.append((row.task, done, total)),
        env_factory=lambda: MiniWoBEnv.from_config(SECTION),
    )
    solved, transform, unknown = rows
    assert solved.reachable and solved.solution[0].startswith('{"action_type":"select"')
    assert solved.solution[-1] == '{"action_type":"click","index":1}'  # the Submit button
    # text-transform's answer joins letters the page shows as separate texts: no candidate types it.
    assert not transform.reachable and transform.reason in ("budget", "unsupported")
    assert unknown.reason == "error" and "no-such-task" in unknown.detail
    assert seen == [("choose-list", 1, 3), ("text-transform", 2, 3), ("no-such-task", 3, 3)]


@pytest.mark.browser
@needs_browser
async def test_the_same_search_runs_through_browsergym_on_the_same_pages(tmp_path: Path) -> None:
    [row] = await check_suite(
        ["click-test-2"], budget_s=60.0, max_episodes=2, env_factory=lambda: BrowserGymEnv(browsers_dir=tmp_path)
    )
    # BrowserGym's calls name no label: the search orders them by the label of the element they act on, so the
    # button the instruction names is tried first and solves it in the first episode.
    assert row.reachable and row.episodes == 1 and len(row.solution) == 1 and row.solution[0].startswith("click(")
