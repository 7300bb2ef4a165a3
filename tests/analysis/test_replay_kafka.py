"""`replay stats|export|report` through the CLI against a real broker: selections, undecodable records, no group."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from distrl_stream.cli.main import app
from distrl_stream.config import Config
from distrl_stream.events import encode, event_key
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.testing.samples import png, sample_trajectory, sample_weight_version, with_screenshots

pytestmark = pytest.mark.kafka
runner = CliRunner()


@pytest.fixture
def recorded(run_config: Config, run_topics: TopicNames) -> dict[str, int]:
    """12 trajectories (one per partition in turn), a garbage record and two weight versions; returns counts."""
    rng = random.Random(5)
    steps = 0
    with Producer(run_config.kafka) as producer:
        for i in range(12):
            event = sample_trajectory(
                rng, run=run_config.run, steps=1 + i % 3, observation_chars=50, policy_version=i // 6
            )
            steps += len(event.steps)
            partition = i % run_config.kafka.trajectory_partitions
            producer.produce(run_topics.trajectories, encode(event), event_key(event), partition=partition)
        producer.produce(run_topics.trajectories, b"not avro", b"garbage", partition=0)
        for version in (1, 2):
            producer.produce_event(run_topics.weights, sample_weight_version(rng, version=version))
        producer.flush()
    return {"episodes": 12, "steps": steps}


def _flags(cfg: Config) -> list[str]:
    return ["--run", cfg.run, "-b", cfg.kafka.bootstrap_servers]


def test_stats_count_every_trajectory_and_skip_garbage_with_a_warning(
    run_config: Config, recorded: dict[str, int]
) -> None:
    result = runner.invoke(app, ["replay", "stats", *_flags(run_config), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert (stats["episodes"], stats["steps"]) == (recorded["episodes"], recorded["steps"])
    assert stats["versions_published"] == 2 and stats["max_policy_version"] == 1
    assert "skipped 1 records that do not decode" in result.stderr


def test_export_rows_equal_trajectories_and_steps(run_config: Config, recorded: dict[str, int], tmp_path: Path) -> None:
    episodes = runner.invoke(app, ["replay", "export", str(tmp_path / "e.parquet"), *_flags(run_config)])
    assert episodes.exit_code == 0, episodes.output
    assert pq.read_table(tmp_path / "e.parquet").num_rows == recorded["episodes"]
    steps = runner.invoke(app, ["replay", "export", str(tmp_path / "s.jsonl"), "--per", "step", *_flags(run_config)])
    assert steps.exit_code == 0, steps.output
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == recorded["steps"]


def test_export_with_images_draws_a_sheet_per_episode_with_screenshots(
    run_config: Config, run_topics: TopicNames, tmp_path: Path
) -> None:
    rng = random.Random(9)
    plain = sample_trajectory(rng, run=run_config.run, steps=2)
    shown = [
        with_screenshots(sample_trajectory(rng, run=run_config.run, steps=3), [png((64, 64), (i, 0, 0))] * 3, tmp_path)
        for i in range(2)
    ]
    altered = shown[1].steps[0].screenshot_uri
    assert altered is not None
    # The episode shows one screen three times, stored once: altering it spoils all three tiles.
    Path(altered.removeprefix("file://")).write_bytes(b"replaced")
    with Producer(run_config.kafka) as producer:
        for event in (plain, *shown):
            producer.produce(run_topics.trajectories, encode(event), event_key(event))
        producer.flush()
    result = runner.invoke(app, ["replay", "export", str(tmp_path / "x.jsonl"), "--images", *_flags(run_config)])
    assert result.exit_code == 0, result.output
    assert "2 contact sheets of 6 steps, 3 screenshots missing or altered" in result.stdout
    sheets = sorted((tmp_path / "x.images").iterdir())
    assert [p.name for p in sheets] == sorted(f"{e.episode_id}.png" for e in shown)
    assert all(Image.open(p).format == "PNG" for p in sheets)


def test_partition_and_offset_selection(run_config: Config, recorded: dict[str, int], tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    args = ["replay", "export", str(out), *_flags(run_config), "--partition", "1", "--start-offset", "1"]
    assert runner.invoke(app, args).exit_code == 0
    rows = pq.read_table(out).to_pylist()
    # 12 records round-robin over 4 partitions: partition 1 holds offsets 0..2; from offset 1: two of them.
    assert [(r["partition"], r["offset"]) for r in rows] == [(1, 1), (1, 2)]
    recent = runner.invoke(app, ["replay", "stats", *_flags(run_config), "--since", "1h", "--json"])
    assert json.loads(recent.stdout)["episodes"] == recorded["episodes"]
    future = runner.invoke(app, ["replay", "stats", *_flags(run_config), "--since", "2999-01-01", "--json"])
    assert json.loads(future.stdout)["episodes"] == 0


def test_report_writes_plots_and_summary(run_config: Config, recorded: dict[str, int], tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", "report", str(tmp_path / "report"), *_flags(run_config)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert names == sorted(
        ["summary.md", "success_over_time.png", "trajectories_over_time.png", "lag_histogram.png", "length_by_task.png"]
    )
    assert f"| episodes | {recorded['episodes']} (" in (tmp_path / "report" / "summary.md").read_text()


def test_replays_never_create_or_join_a_consumer_group(
    run_config: Config, recorded: dict[str, int], kafka_admin: Admin, tmp_path: Path
) -> None:
    def groups() -> set[str]:
        return {g.group_id for g in kafka_admin.client.list_consumer_groups().result(timeout=30).valid}

    before = groups()
    for command in (["stats"], ["export", str(tmp_path / "x.parquet")], ["report", str(tmp_path / "r")]):
        assert runner.invoke(app, ["replay", *command, *_flags(run_config)]).exit_code == 0
    assert groups() - before == set()


def test_a_run_without_topics_fails_in_one_line(run_config: Config) -> None:
    result = runner.invoke(app, ["replay", "stats", "--run", "no-such-run", "-b", run_config.kafka.bootstrap_servers])
    assert result.exit_code == 1
    assert "no-such-run.trajectories" in result.output and "Traceback" not in result.output
