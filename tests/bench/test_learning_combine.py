"""bench/learning.py's combination of seeds: time to a target, the censoring rule, the geometric mean and its interval,
and --combine on synthetic per-seed files (no services: the pure functions only)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import learning

BUDGET = 120.0
LATENCY = {"model": "lognormal", "mean_s": 0.5, "sigma": 0.5, "task_spread": 100.0}


def curve(*points: tuple[float, float]) -> list[dict[str, Any]]:
    """A held-out success curve from (seconds, success) points, one version each."""
    return [{"version": v, "seconds": t, "success": s} for v, (t, s) in enumerate(points, start=1)]


def reaching(seconds: float | None) -> list[dict[str, Any]]:
    """A curve from the warm start's 0.5 that reaches 0.8 at ``seconds`` (never within the budget: None)."""
    if seconds is None:
        return curve((5.0, 0.5), (60.0, 0.6), (115.0, 0.65))
    return curve((5.0, 0.5), (seconds, 0.8), (115.0, 0.75))


def write_run(path: Path, seed: int, curves: dict[str, list[dict[str, Any]]], **metrics: Any) -> Path:
    """A per-seed result file as bench/learning.py writes it, with what --combine reads; ``metrics`` overrides."""
    fields: dict[str, Any] = {
        "seed": seed,
        "curves": curves,
        "auc": {m: learning.area_under(c, BUDGET) for m, c in curves.items()},
        "final_success": {m: c[-1]["success"] for m, c in curves.items()},
        "best_success": {m: max(p["success"] for p in c) for m, c in curves.items()},
        "learner_updates": {m: 10 * len(c) for m, c in curves.items()},
        "versions_published": {m: len(c) for m, c in curves.items()},
        "trajectories": {m: 100 * len(c) for m, c in curves.items()},
        "collected_successes": {m: 10 * len(c) for m, c in curves.items()},
        "method_settings": {m: learning.METHODS[m] for m in curves},
        "target_success": 0.7,
        "latency": LATENCY,
        "warm_start_success": 0.5,
        "warm_start_weights_sha256": "0" * 64,
        "base_weights_sha256": "a" * 64,
        "untrained_success": 0.0,
        "budget_s_per_method": BUDGET,
        "eval_tasks": 40,
        "env": "sim",
        "templates": ["take_photo", "turn_on_setting"],
        "envs": 16,
        "learner": learning.LEARNER,
        "precision": "auto",
    }
    run = {"name": "learning", "quick": False, "ratio": None, "target": learning.TARGET_RATIO}
    path.write_text(json.dumps(run | {"metrics": fields | metrics}))
    return path


def test_time_to_a_target_is_the_first_evaluated_version_at_or_above_it() -> None:
    points = curve((5.0, 0.5), (40.0, 0.7), (80.0, 0.65), (115.0, 0.9))
    assert learning.time_to(points, 0.7) == 40.0
    assert learning.time_to(points, 0.8) == 115.0
    assert learning.time_to(points, 0.95) is None
    assert learning.time_to([], 0.5) is None


def test_a_target_held_twice_ignores_a_single_point_above_it() -> None:
    points = curve((5.0, 0.5), (40.0, 0.7), (80.0, 0.65), (100.0, 0.75), (115.0, 0.8))
    assert learning.time_to(points, 0.7, held=2) == 100.0
    assert learning.time_to(points, 0.8, held=2) is None  # the last point alone: not held
    assert learning.time_to(points, 0.5, held=2) == 5.0
    with pytest.raises(ValueError, match="held"):
        learning.time_to(points, 0.5, held=0)


def test_a_curve_that_ends_at_the_target_unheld_is_censored_where_its_last_run_began() -> None:
    # Sync crosses at its last point only: held twice it never reached 0.8, but the next evaluation might have held
    # it, so its time is at least 115 s, not the 120 s budget, and the lower bound on the ratio is 115 / 40.
    sync = curve((5.0, 0.5), (60.0, 0.6), (115.0, 0.85))
    entry = learning.seed_speedup(sync, reaching(40.0), 0.7, BUDGET, held=2)
    assert entry["kind"] == "lower_bound" and entry["ratio"] == pytest.approx(115.0 / 40.0)
    assert learning.seed_speedup(sync, reaching(40.0), 0.7, BUDGET)["kind"] == "exact"  # one point is enough
    # Held twice, a noisy first point is not a start at the target.
    noisy_start = curve((5.0, 0.75), (20.0, 0.6), (60.0, 0.8), (80.0, 0.8))
    assert learning.seed_speedup(reaching(60.0), noisy_start, 0.7, BUDGET)["kind"] == "at_start"
    assert learning.seed_speedup(reaching(60.0), noisy_start, 0.7, BUDGET, held=2)["kind"] == "exact"


@pytest.mark.parametrize(
    ("sync_s", "async_s", "kind", "ratio"),
    [
        (60.0, 20.0, "exact", 3.0),
        (None, 40.0, "lower_bound", BUDGET / 40.0),  # sync took longer than the budget: the ratio is at least B/t
        (60.0, None, "upper_bound", 60.0 / BUDGET),  # async took longer than the budget: at most t/B
        (None, None, "unknown", None),
    ],
)
def test_a_seed_s_speedup_is_exact_or_bounded_by_the_budget(
    sync_s: float | None, async_s: float | None, kind: str, ratio: float | None
) -> None:
    entry = learning.seed_speedup(reaching(sync_s), reaching(async_s), 0.7, BUDGET)
    assert entry == {"sync_s": sync_s, "async_s": async_s, "kind": kind, "ratio": ratio}


def test_a_curve_starting_at_the_target_measures_no_learning() -> None:
    started = curve((5.0, 0.75), (60.0, 0.8))
    assert learning.seed_speedup(reaching(60.0), started, 0.7, BUDGET)["kind"] == "at_start"
    assert learning.seed_speedup(started, reaching(20.0), 0.7, BUDGET)["kind"] == "at_start"


@pytest.mark.parametrize(("df", "quantile"), [(1, 12.706), (2, 4.303), (4, 2.776), (7, 2.365), (30, 2.042)])
def test_t_quantile_matches_the_tables(df: int, quantile: float) -> None:
    assert learning.t_quantile_975(df) == pytest.approx(quantile, abs=1e-3)


def test_geometric_mean_and_its_t_interval_on_the_logs() -> None:
    mean, interval = learning.geometric_mean_ci([2.0, 8.0])
    assert mean == pytest.approx(4.0)
    # logs ln 2 and ln 8: standard deviation ln 4 / √2, standard error ln 4 / 2, t(0.975, 1 df) = 12.706.
    half = learning.t_quantile_975(1) * math.log(4.0) / 2
    assert interval == pytest.approx((4.0 * math.exp(-half), 4.0 * math.exp(half)))
    assert learning.geometric_mean_ci([3.0]) == (pytest.approx(3.0), None)


def test_the_mean_is_null_while_a_seed_leaves_the_ratio_unbounded_below() -> None:
    entries = [learning.seed_speedup(reaching(s), reaching(a), 0.7, BUDGET) for s, a in [(60, 20), (60, None)]]
    summary = learning.speedup_over_seeds("aride_async", [3, 4], entries)
    assert summary["geometric_mean"] is None
    assert summary["counts"] == {"exact": 1, "lower_bound": 0, "upper_bound": 1, "unknown": 0, "at_start": 0}
    assert summary["reason"] == "aride_async never reached the target within the budget while digirl_sync did (seed 4)"
    assert [e["seed"] for e in summary["per_seed"]] == [3, 4]


def test_a_censored_sync_seed_enters_at_its_bound_and_marks_the_mean_a_lower_bound() -> None:
    entries = [learning.seed_speedup(reaching(s), reaching(a), 0.7, BUDGET) for s, a in [(60, 20), (None, 40)]]
    summary = learning.speedup_over_seeds("aride_async", [0, 1], entries)
    assert summary["geometric_mean"] == pytest.approx(3.0)  # 3.0 exact and 120 / 40 = 3.0 at least
    assert summary["lower_bound"] is True
    assert summary["reason"] is None


def seed_files(tmp_path: Path) -> list[Path]:
    """Three seeds: sync ÷ A-RIDE 60/20 = 3, 60/30 = 2, and sync never within 120 s while A-RIDE took 40 (≥ 3)."""
    times = [(20.0, 60.0), (30.0, 60.0), (40.0, None)]
    return [
        write_run(
            tmp_path / f"seed{seed}.json",
            seed,
            {"aride_async": reaching(a), "digirl_async": reaching(60.0), "digirl_sync": reaching(s)},
        )
        for seed, (a, s) in enumerate(times)
    ]


def test_combine_gives_the_geometric_mean_over_seeds_with_its_interval_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "combined.json"
    result = learning.combine(seed_files(tmp_path), out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert out.with_suffix(".png").stat().st_size > 0
    metrics = result["metrics"]
    assert metrics["seeds"] == [0, 1, 2]
    assert metrics["target_success"] == 0.7
    assert metrics["ratio_per_seed"] == pytest.approx([3.0, 2.0, 3.0])
    assert metrics["ratio_kind_per_seed"] == ["exact", "exact", "lower_bound"]
    logs = [math.log(3.0), math.log(2.0), math.log(3.0)]
    centre = sum(logs) / 3
    half = learning.t_quantile_975(2) * math.sqrt(sum((x - centre) ** 2 for x in logs) / 2) / math.sqrt(3)
    assert result["ratio"] == pytest.approx(18 ** (1 / 3))
    assert metrics["ratio_ci95"] == pytest.approx([math.exp(centre - half), math.exp(centre + half)])
    assert metrics["ratio_lower_bound"] is True
    assert result["ratio_reason"] is None
    assert metrics["sync_speedup"]["aride_async"]["counts"]["lower_bound"] == 1
    assert metrics["sync_speedup"]["digirl_async"]["per_seed"][2]["kind"] == "lower_bound"
    assert metrics["reached_target"] == {"aride_async": 3, "digirl_async": 3, "digirl_sync": 2}
    assert metrics["trajectories"]["digirl_sync"] == {"mean": 300, "std": 0.0, "values": [300, 300, 300]}
    assert metrics["collected_successes"]["digirl_sync"]["values"] == [30, 30, 30]
    assert metrics["time_to_target_s"]["digirl_sync"]["values"] == [60.0, 60.0, None]
    assert metrics["aride_area_against"]["digirl_async"]["holds"] is True
    assert metrics["latency"]["task_spread"] == 100.0 and "log-normal" in metrics["latency"]["note"]
    # Every curve stays above 0.7 after it crosses: held twice, each seed's ratio is the same.
    held = metrics["sync_speedup_held_twice"]["aride_async"]
    assert [e["ratio"] for e in held["per_seed"]] == pytest.approx([3.0, 2.0, 3.0])


def test_combine_also_times_the_target_held_twice_which_a_noisy_point_does_not_reach(tmp_path: Path) -> None:
    noisy = curve((5.0, 0.5), (20.0, 0.8), (40.0, 0.6), (60.0, 0.8), (115.0, 0.8))
    files = [
        write_run(tmp_path / f"seed{seed}.json", seed, {"aride_async": noisy, "digirl_sync": reaching(60.0)})
        for seed in (0, 1)
    ]
    metrics = learning.combine(files, tmp_path / "combined.json")["metrics"]
    assert metrics["sync_speedup"]["aride_async"]["geometric_mean"] == pytest.approx(3.0)  # 60 / 20
    assert metrics["sync_speedup_held_twice"]["aride_async"]["geometric_mean"] == pytest.approx(1.0)  # 60 / 60


def test_combine_recomputes_every_time_at_a_target_given_to_it(tmp_path: Path) -> None:
    result = learning.combine(seed_files(tmp_path), tmp_path / "combined.json", target=0.9)
    assert result["metrics"]["target_success"] == 0.9
    assert result["metrics"]["reached_target"] == {"aride_async": 0, "digirl_async": 0, "digirl_sync": 0}
    assert result["ratio"] is None
    assert (
        result["ratio_reason"]
        == "neither aride_async nor digirl_sync reached the target within the budget (seed 0, 1, 2)"
    )


def test_combine_reads_files_written_before_the_target_and_sigma_were_recorded(tmp_path: Path) -> None:
    old_latency = {"model": "lognormal", "mean_s": 0.5, "task_spread": 100.0}  # run at EnvConfig's sigma, 0.5
    files = seed_files(tmp_path)
    run = json.loads(files[0].read_text())
    del run["metrics"]["target_success"]
    run["metrics"]["latency"] = old_latency
    files[0].write_text(json.dumps(run))
    # The old file's target was the fixed 0.8: the others' 0.7 differs, until --combine is given one.
    with pytest.raises(SystemExit, match="differ in target_success"):
        learning.combine(files, tmp_path / "combined.json")
    assert learning.combine(files, tmp_path / "combined.json", target=0.7)["ratio"] == pytest.approx(18 ** (1 / 3))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("latency", LATENCY | {"task_spread": 1.0}, "latency model"),
        ("latency", LATENCY | {"sigma": 0.1}, "latency model"),
        ("precision", "float32", "differ in precision"),
        ("warm_start_weights_sha256", "1" * 64, "one warm start"),
        ("base_weights_sha256", "b" * 64, "tiny models differ"),
        ("seed", 0, "seed 0's files repeat a method"),
    ],
)
def test_combine_refuses_files_that_differ_where_it_matters(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    files = seed_files(tmp_path)
    run = json.loads(files[1].read_text())
    run["metrics"][field] = value
    files[1].write_text(json.dumps(run))
    with pytest.raises(SystemExit, match=message):
        learning.combine(files, tmp_path / "combined.json")


def test_combine_unites_a_seed_s_methods_run_in_separate_invocations(tmp_path: Path) -> None:
    # Each seed's A-RIDE in one file, its baselines in another run later at the same settings, zero-shot evaluated
    # again there: the combination is the one of a file a seed holding all three.
    whole = learning.combine(seed_files(tmp_path), tmp_path / "whole.json")["metrics"]
    split = []
    for seed, path in enumerate(seed_files(tmp_path)):
        curves = json.loads(path.read_text())["metrics"]["curves"]
        aride = {"aride_async": curves.pop("aride_async")}
        split.append(write_run(tmp_path / f"aride{seed}.json", seed, aride, untrained_success=0.2))
        split.append(write_run(tmp_path / f"baselines{seed}.json", seed, curves, untrained_success=0.4))
    result = learning.combine(split, tmp_path / "split.json")
    metrics = result["metrics"]
    assert metrics["seeds"] == [0, 1, 2]
    assert list(metrics["auc"]) == ["aride_async", "digirl_async", "digirl_sync"]
    for key in ("auc", "final_success", "trajectories", "time_to_target_s", "sync_speedup", "aride_area_against"):
        assert metrics[key] == whole[key]
    assert result["ratio"] == pytest.approx(18 ** (1 / 3))
    # Six evaluations of the starting policy, two a seed.
    assert metrics["untrained_success"]["values"] == [0.2, 0.4] * 3
    assert metrics["untrained_success"]["mean"] == pytest.approx(0.3)
    assert len(metrics["files"]) == 6


def test_a_seed_s_files_merge_into_one_run_with_the_mean_of_their_starts(tmp_path: Path) -> None:
    first = write_run(tmp_path / "a.json", 3, {"aride_async": reaching(20.0)}, untrained_success=0.2)
    second = write_run(
        tmp_path / "b.json", 3, {"digirl_sync": reaching(60.0)}, untrained_success=0.4, warm_start_success=0.7
    )
    older = json.loads(second.read_text())
    del older["metrics"]["trajectories"]  # written before the episodes were counted
    (merged,) = learning.merge_seeds([json.loads(first.read_text()), older])
    metrics = merged["metrics"]
    assert list(metrics["curves"]) == list(metrics["auc"]) == ["aride_async", "digirl_sync"]
    assert metrics["curves"]["digirl_sync"] == reaching(60.0)
    assert metrics["untrained_success"] == pytest.approx(0.3)
    assert metrics["warm_start_success"] == pytest.approx(0.6)
    assert "trajectories" not in metrics  # one file lacks it: none, as for a seed whose one file lacks it


def test_combine_pools_files_written_before_the_base_model_was_recorded(tmp_path: Path) -> None:
    files = seed_files(tmp_path)
    run = json.loads(files[1].read_text())
    del run["metrics"]["base_weights_sha256"]
    files[1].write_text(json.dumps(run))
    assert learning.combine(files, tmp_path / "combined.json")["metrics"]["seeds"] == [0, 1, 2]


def asking(path: Path, precision: str, resolved: str | None) -> None:
    """Rewrite a seed file as run with ``--precision precision``, ``auto`` having become ``resolved`` on its machine
    (None: a file written before that was recorded)."""
    run = json.loads(path.read_text())
    run["metrics"]["precision"] = precision
    run["metrics"].pop("precision_resolved", None)
    if resolved is not None:
        run["metrics"]["precision_resolved"] = resolved
    path.write_text(json.dumps(run))


def test_combine_pools_auto_with_the_precision_it_became(tmp_path: Path) -> None:
    files = seed_files(tmp_path)
    for path in files[:2]:
        asking(path, "auto", "float32")
    asking(files[2], "float32", "float32")
    assert learning.combine(files, tmp_path / "combined.json")["metrics"]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize(
    ("other", "resolved"), [("auto", "bfloat16"), ("auto", None), ("bfloat16", "bfloat16")], ids=str
)
def test_combine_refuses_auto_that_became_another_precision_or_is_unknown(
    tmp_path: Path, other: str, resolved: str | None
) -> None:
    files = seed_files(tmp_path)
    for path in files[:2]:
        asking(path, "float32", "float32")
    asking(files[2], other, resolved)
    with pytest.raises(SystemExit, match="differ in precision"):
        learning.combine(files, tmp_path / "combined.json")


def test_combine_says_why_there_is_no_ratio_without_a_sync_arm(tmp_path: Path) -> None:
    files = [write_run(tmp_path / f"s{seed}.json", seed, {"aride_async": reaching(20.0)}) for seed in (0, 1)]
    result = learning.combine(files, tmp_path / "combined.json")
    assert result["ratio"] is None
    assert result["ratio_reason"] == "no digirl_sync arm in every file"


def test_mean_band_reads_each_seed_linearly_and_flat_beyond_its_points() -> None:
    curves = [curve((10.0, 0.2), (20.0, 0.4)), curve((10.0, 0.4), (20.0, 0.8)), []]
    mean, std = learning.mean_band(curves, [0.0, 15.0, 30.0])
    assert mean == pytest.approx([0.3, 0.45, 0.6])
    assert std == pytest.approx([math.sqrt(0.02), math.sqrt(0.045), math.sqrt(0.08)])


def test_a_success_target_is_a_fraction() -> None:
    assert learning.success_rate("0.7") == 0.7
    for text in ("0", "1.5", "-0.1"):
        with pytest.raises(argparse.ArgumentTypeError):
            learning.success_rate(text)
