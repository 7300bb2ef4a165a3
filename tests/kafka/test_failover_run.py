"""A whole run on the 3-node cluster loses a broker: learner, vLLM server and two collectors go on, exactly once.

The learner and the collectors are the real CLIs (processes); the session's vLLM server serves the tiny model and an
in-process weight watcher hot-loads the learner's versions into it (what ``distrl-stream serve`` runs). Mid-run the
node leading most trajectory partitions is SIGKILLed, and restarted a while later. The audit reads the topic and the
learner's ingest log: each collector's delivered episodes are on ``{run}.trajectories`` exactly once, and every one
was ingested exactly once; updates and served versions went on after the kill.

Slow (three JVMs, vLLM, a learner and two collectors on one machine: several minutes on two cores): ``make
test-cluster`` runs it; ``test_broker_cluster.py`` is the broker-loss test every ``make test`` runs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from distrl_stream.config import Config
from distrl_stream.events import TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.broker import EmbeddedCluster
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import CheckpointStore, IngestLog, checkpoints_dir, learner_dir, read_json
from tests.fixtures.processes import CLI, ChildProcesses
from tests.fixtures.vllm import VllmService

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(1200)]


@pytest.fixture
def cluster_run(
    kafka_cluster: EmbeddedCluster, make_config: Callable[..., Config], vllm_server: VllmService
) -> Iterator[tuple[Config, WeightWatcher]]:
    cfg = make_config(
        kafka={"bootstrap_servers": kafka_cluster.bootstrap_servers, "replication_factor": 3},
        model={"base": vllm_server.model_dir},
        inference={"url": vllm_server.url, "request_timeout_s": 20.0},
    )
    ensure_run_topics(cfg)
    watcher = WeightWatcher(cfg, server_url=vllm_server.url)  # what `serve` runs beside vLLM
    watcher.start()
    try:
        yield cfg, watcher
    finally:
        watcher.stop()
        vllm_server.unload_all_adapters()


def test_run_loses_a_broker_and_keeps_every_episode_exactly_once(
    kafka_cluster: EmbeddedCluster,
    cluster_run: tuple[Config, WeightWatcher],
    vllm_server: VllmService,
    processes: ChildProcesses,
) -> None:
    cfg, watcher = cluster_run
    topics = TopicNames(cfg.run)
    admin = Admin(cfg.kafka)
    env = {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_KAFKA__REPLICATION_FACTOR": "3",
        "DISTRL_INFERENCE__URL": vllm_server.url,
        "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "20",
        "DISTRL_LEARNER__BATCH_EPISODES": "4",
        "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "4",
        "DISTRL_LEARNER__UPDATES_PER_VERSION": "3",
        "DISTRL_LEARNER__CHECKPOINT_INTERVAL_UPDATES": "3",
        "DISTRL_LEARNER__PRIORITY_REFRESH_INTERVAL": "1000",
        "DISTRL_LEARNER__DROP_ABOVE_POLICY_LAG": "1000",  # every episode counts as ingested for the audit
        "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
    }
    run = processes
    bootstrap = ["--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]
    learner = run.start([CLI, "learn", *bootstrap, "--model", str(cfg.model.base), "--threads", "1"], env)
    collectors = {
        c: run.start([CLI, "collect", *bootstrap, "--envs", "4", "--collector-id", c, "--json"], env, report=c)
        for c in ("c0", "c1")
    }
    store = CheckpointStore(checkpoints_dir(cfg.run_dir))

    def updates() -> int:
        latest = store.latest()
        return 0 if latest is None else int(read_json(latest / "state.json")["updates"])

    run.wait_for("version 2 served", lambda: watcher.newest_version >= 2, 600)
    leaders = Counter(p.leader for p in admin.describe_topic(topics.trajectories).partitions)
    victim = kafka_cluster.node(leaders.most_common(1)[0][0])
    victim.kill()
    updates_at_kill, version_at_kill = updates(), watcher.newest_version
    run.wait_for("3 more updates without the node", lambda: updates() >= updates_at_kill + 3, 300)
    victim.start()
    run.wait_for("a version after the restart served", lambda: watcher.newest_version >= version_at_kill + 2, 300)

    for c, collector in collectors.items():
        assert run.stop(collector) == 0, f"{c}:\n{run.tail()}"
    ends = {p.partition: p.high for p in admin.describe_topic(topics.trajectories).partitions}

    def caught_up() -> bool:
        latest = store.latest()
        offsets = {} if latest is None else read_json(latest / "state.json")["offsets"]
        return all(offsets.get(str(p), 0) >= end for p, end in ends.items())

    run.wait_for("the learner to checkpoint past every trajectory", caught_up, 300)
    assert run.stop(learner) == 0, run.tail()
    final = read_json(store.latest() / "state.json")  # type: ignore[operator]

    reports = {c: run.report(c) for c in ("c0", "c1")}
    on_topic: Counter[str] = Counter()
    by_collector: Counter[str] = Counter()
    for msg in read_topic(cfg.kafka, topics.trajectories, timeout_s=120):
        event = decode(msg.value(), TrajectoryEvent)
        on_topic[event.episode_id] += 1
        by_collector[event.collector_id] += 1
    records = IngestLog.read(learner_dir(cfg.run_dir, "0") / "ingested.log")
    ingested = Counter(r.episode_id for r in records)
    versions = [decode(m.value(), WeightVersionEvent).version for m in read_topic(cfg.kafka, topics.weights)]
    print(
        f"killed {victim.run_dir.name}; published {[reports[c]['delivered'] for c in reports]}, "
        f"on topic {sum(on_topic.values())} ({len(on_topic)} distinct), ingest log {len(records)} "
        f"({Counter(r.status for r in records)}), duplicates {sum(n - 1 for n in on_topic.values())}, "
        f"lost {sum(int(r['delivered']) for r in reports.values()) - len(on_topic)}; updates {updates_at_kill} at the "
        f"kill, {final['updates']} at the end; versions {version_at_kill} at the kill, published up to "
        f"{max(versions)}, newest served {watcher.newest_version}"
    )
    for c, report in reports.items():
        assert report["publish_failures"] == 0 and report["undelivered"] == 0, report
        assert report["delivered"] == report["published"] == by_collector[c]
    assert max(on_topic.values()) == 1  # no episode twice on the topic
    assert set(ingested) == set(on_topic) and max(ingested.values()) == 1  # each ingested (or judged) once
    assert final["updates"] >= updates_at_kill + 3
    assert watcher.newest_version >= version_at_kill + 2 and versions == list(range(1, max(versions) + 1))
