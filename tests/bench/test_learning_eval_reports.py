"""bench/learning.py's evaluation reports: each method's evaluations written as `distrl-stream eval` writes its report
(no services: the results are built here)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import learning
from distrl_stream.collector.evaluation import EvalResult
from distrl_stream.collector.heldout import EvalPlan
from distrl_stream.config import load_config
from distrl_stream.policy.pretrained import PROVENANCE_FILE


def result(version: int, successes: int, *, by_task: dict[str, tuple[int, int]]) -> EvalResult:
    return EvalResult(
        version=version,
        episodes=4,
        successes=successes,
        by_template={"click-test": (successes, 4)},
        by_task=by_task,
        versions_seen=(version,),
        mean_steps=1.5,
    )


def test_each_method_gets_its_report_with_zero_shot_first(tmp_path: Path) -> None:
    pulled = tmp_path / "models" / "smollm2-135m-instruct"
    pulled.mkdir(parents=True)
    (pulled / PROVENANCE_FILE).write_text(json.dumps({"name": "smollm2-135m-instruct"}))
    cfg = load_config(None, run="bench-run", model={"base": str(pulled)})
    zero_shot = result(0, 1, by_task={"click-test/0": (1, 2), "click-test/1": (0, 2)})
    results = {
        "aride_async": [result(3, 2, by_task={"click-test/0": (2, 2)}), result(7, 4, by_task={"click-test/0": (2, 2)})],
        "digirl_sync": [result(2, 0, by_task={"click-test/1": (0, 2)})],
    }
    out = tmp_path / "learning_seed0.json"

    written = learning.write_eval_reports(cfg, out, zero_shot, results, EvalPlan(tasks=4), "http://127.0.0.1:1")

    assert [p.name for p in written] == ["learning_seed0_eval_aride_async.json", "learning_seed0_eval_digirl_sync.json"]
    aride = json.loads(written[0].read_text())
    assert aride["run"] == "bench-run-aride_async"
    assert [r["version"] for r in aride["results"]] == [0, 3, 7]
    assert [r["successes"] for r in aride["results"]] == [1, 2, 4]
    assert aride["results"][0]["by_task"]["click-test/1"] == {"successes": 0, "episodes": 2}
    assert aride["tasks"] == 4 and aride["split"] == "test" and aride["model"] == "smollm2-135m-instruct"
    sync = json.loads(written[1].read_text())
    assert [r["version"] for r in sync["results"]] == [0, 2]
    markdown = written[0].with_suffix(".md").read_text()
    assert "| v0 | v3 | v7 |" in markdown and "`click-test/1`" in markdown
