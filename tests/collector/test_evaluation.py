"""Held-out evaluation with any policy: one episode per task in fresh environments, summed by template."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from transformers import AutoTokenizer

from distrl_stream.collector.evaluation import evaluate_policy, held_out_tasks
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
    assert result.mean_steps >= 1 and result.versions_seen == (0,)  # the scripted policy tags its steps version 0
