"""Held-out evaluation with any policy: one episode per task in fresh environments, summed by template and task; the
Wilson interval of a success rate."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from distrl_stream.collector.evaluation import evaluate_policy, held_out_tasks, wilson_interval
from distrl_stream.config import load_config
from distrl_stream.testing.scripted import ScriptedPolicy


def test_a_random_reference_plays_every_held_out_task_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, data_dir=tmp_path, env={"templates": ["take_photo", "alarm_on"], "latency": "none"})
    tasks = held_out_tasks(cfg, 12)
    policy = ScriptedPolicy(None, AutoTokenizer.from_pretrained(tiny_model_dir), 1.0, random.Random(0))
    result = asyncio.run(evaluate_policy(cfg, tasks, policy, concurrency=3, version=7))
    assert result.version == 7 and result.episodes == len(tasks) == 12 and result.errors == 0
    counted = {t: ran for t, (_won, ran) in result.by_template.items()}
    assert counted == {t: sum(task.template == t for task in tasks) for t in ("alarm_on", "take_photo")}
    assert result.successes == sum(won for won, _ran in result.by_template.values())
    assert result.by_task == {task.id: result.by_task[task.id] for task in tasks}
    assert all(ran == 1 for _won, ran in result.by_task.values())
    assert result.successes == sum(won for won, _ran in result.by_task.values())
    assert result.mean_steps >= 1 and result.versions_seen == (0,)  # the scripted policy tags its steps version 0


@pytest.mark.parametrize(
    ("successes", "episodes", "low", "high"),
    [
        # p̂ = 0.5, z² = 3.8415: centre (0.5 + 0.1921) / 1.3841 = 0.5, half 1.9600 / 1.3841 × √(0.025 + 0.0096) = 0.2634
        (5, 10, 0.2366, 0.7634),
        # no success: centre = half = (z²/2n) / (1 + z²/n) = 0.0480 / 1.0960 = 0.0438, so the interval is 0 to 0.0876
        (0, 40, 0.0, 0.0876),
        # 22 of 40: p̂ 0.55, centre (0.55 + 0.0480) / 1.0960 = 0.5456, half 1.7882 × √(0.0061875 + 0.0006002) = 0.1473
        (22, 40, 0.3983, 0.6929),
        # every success: centre (1 + 0.0480) / 1.0960 = 0.9562, half 1.7882 × √0.0006002 = 0.0438
        (40, 40, 0.9124, 1.0),
    ],
)
def test_wilson_interval_matches_hand_computed_bounds(successes: int, episodes: int, low: float, high: float) -> None:
    assert wilson_interval(successes, episodes) == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_of_no_episodes_is_everything() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
