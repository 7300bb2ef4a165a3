"""The chaos soak (tests/chaos.py): a whole run while a seeded schedule SIGKILLs roles and restarts them, with nothing
lost that no role reports lost and nothing doubled.

- ``test_a_short_soak_loses_and_doubles_nothing`` (``make test``): the session broker and vLLM server (its weight
  watcher in this process, as ``serve`` runs it), a learner group of two and two collectors; three faults, one each of
  a collector, a learner member and the learner agent, 5-10 s apart. It leaves to the cluster variant the kinds that
  need more JVMs or another vLLM start (a policy server, a broker), the 30-60 s rhythm and the length.
- ``test_a_ten_minute_soak_of_every_fault_loses_and_doubles_nothing`` (``make test-cluster``): the 3-node cluster,
  two ``serve`` processes of the soak's own, and at least ten minutes of fifteen faults, three of each kind, 30-60 s
  apart. ``bench/chaos.py`` runs the same soak and writes its figures to ``bench/results/chaos.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from distrl_stream.config import Config
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.broker import EmbeddedCluster
from distrl_stream.kafka.topics import ensure_run_topics
from tests.chaos import KINDS, Soak, run_soak
from tests.fixtures.processes import ChildProcesses
from tests.fixtures.vllm import VllmService

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.slow]

SEED = 32


@pytest.fixture
def watched(make_config: Callable[..., Config], vllm_server: VllmService) -> Iterator[Config]:
    """A run on the session broker whose versions the session's vLLM server loads (what ``serve`` runs beside it)."""
    cfg = make_config(model={"base": vllm_server.model_dir}, kafka={"trajectory_partitions": 4})
    ensure_run_topics(cfg)
    watcher = WeightWatcher(cfg, server_url=vllm_server.url)
    watcher.start()
    try:
        yield cfg
    finally:
        watcher.stop()
        vllm_server.unload_all_adapters()


@pytest.mark.timeout(600)
def test_a_short_soak_loses_and_doubles_nothing(
    watched: Config, vllm_server: VllmService, processes: ChildProcesses, tmp_path: Path
) -> None:
    soak = Soak(watched, processes, tmp_path, inference_urls=[vllm_server.url])
    result = run_soak(
        soak, seed=SEED, faults=3, kinds=("collector", "member", "agent"), gap_s=(5.0, 10.0), min_duration_s=0.0
    )
    print(result["metrics"])
    assert result["violations"] == []
    assert result["metrics"]["faults"] == {"total": 3, "agent": 1, "member": 1, "collector": 1}


@pytest.mark.cluster
@pytest.mark.timeout(3000)
def test_a_ten_minute_soak_of_every_fault_loses_and_doubles_nothing(
    kafka_cluster: EmbeddedCluster,
    make_config: Callable[..., Config],
    tiny_model_dir: Path,
    processes: ChildProcesses,
    tmp_path: Path,
) -> None:
    cfg = make_config(
        kafka={"bootstrap_servers": kafka_cluster.bootstrap_servers, "replication_factor": 3},
        model={"base": tiny_model_dir},
    )
    ensure_run_topics(cfg)
    soak = Soak(cfg, processes, tmp_path, servers=2, cluster=kafka_cluster)
    result = run_soak(soak, seed=SEED, faults=15, kinds=KINDS, gap_s=(30.0, 60.0), min_duration_s=600.0)
    print(result["metrics"])
    assert result["violations"] == []
    assert result["metrics"]["faults"] == {"total": 15, **{kind: 3 for kind in KINDS}}
    assert result["metrics"]["duration_s"] >= 600
