"""A learner group of real processes (the CLI under torch's elastic agent, gloo on the CPU, the tiny model, a real
broker): identical weights, one writer, exactly-once ingest across kill -9 and a member joining, one process per id.

The topic is fed with simulated-phone episodes (tests/learner/simdata.py), so no inference server is needed.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed
from transformers import AutoTokenizer

from distrl_stream.cli.learn import member_args
from distrl_stream.config import Config
from distrl_stream.errors import LearnerError
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode, encode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.checkpoint import CheckpointStore, IngestLog, checkpoints_dir, member_logs, read_json
from distrl_stream.learner.group import AGENT_ENV, AGENT_PID_ENV, MemberLock, Membership, launch_command
from distrl_stream.learner.group import Group as ProcessGroup
from tests.fixtures.processes import CLI, ChildProcesses
from tests.learner.simdata import sim_events

PARTITIONS = 4


@pytest.fixture
def group_run(make_config: Callable[..., Config], tiny_model_dir: Path) -> Config:
    cfg = make_config(model={"base": tiny_model_dir}, kafka={"trajectory_partitions": PARTITIONS})
    ensure_run_topics(cfg)
    return cfg


def _env(cfg: Config, **learner: str) -> dict[str, str]:
    settings = {
        "BATCH_EPISODES": "2",
        "MIN_BUFFER_EPISODES": "2",
        "UPDATES_PER_VERSION": "2",
        "CHECKPOINT_INTERVAL_UPDATES": "2",
        "PRIORITY_REFRESH_INTERVAL": "1000",
        "METRICS_INTERVAL_S": "1",
        "THREADS": "1",
        **learner,
    }
    return {
        **os.environ,
        "DISTRL_DATA_DIR": str(cfg.data_dir),
        "DISTRL_MODEL__BASE": str(cfg.model.base),
        **{f"DISTRL_LEARNER__{k}": v for k, v in settings.items()},
    }


def _learn_args(cfg: Config) -> list[str]:
    return ["--run", cfg.run, "--bootstrap-servers", cfg.kafka.bootstrap_servers]


def last_assignments(log: str) -> dict[str, list[int]]:
    """The partitions each member was last assigned, from the members' log lines."""
    last: dict[str, list[int]] = {}
    for member, parts in re.findall(r"learner (\d) assigned (\[[^\]]*\])", re.sub(r"\s+", " ", log)):
        last[member] = [p for p, _offset in ast.literal_eval(parts)]
    return last


def produce(cfg: Config, n: int, seed: int) -> None:
    """``n`` episodes spread over every partition (keyed by episode id, as collectors publish)."""
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.base)
    with Producer(cfg.kafka, client_id="test-collector") as producer:
        for event in sim_events(tokenizer, n, seed=seed, run=cfg.run):
            producer.produce(TopicNames(cfg.run).trajectories, encode(event), key=event.episode_id.encode())
        producer.flush()


def latest_state(cfg: Config) -> dict | None:
    latest = CheckpointStore(checkpoints_dir(cfg.run_dir)).latest()
    return read_json(latest / "state.json") if latest is not None else None


def updates_at_least(cfg: Config, n: int) -> Callable[[], bool]:
    def check() -> bool:
        state = latest_state(cfg)
        return state is not None and state["updates"] >= n

    return check


def member_pid(cfg: Config, member: str) -> int:
    return int((cfg.run_dir / "learner" / member / ".lock").read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by the process it was handed to, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def audit(cfg: Config) -> dict:
    """The members' ingest logs against the topic, up to the last checkpoint's offsets: nothing lost, nothing twice."""
    state = latest_state(cfg)
    assert state is not None
    records = [r for path in member_logs(cfg.run_dir).values() for r in IngestLog.read(path)]
    for partition, end in state["offsets"].items():
        offsets = sorted(r.offset for r in records if r.partition == int(partition))
        assert offsets == list(range(end)), f"partition {partition}: gaps or duplicates"
    assert len(records) == sum(state["offsets"].values()), "lines beyond the checkpoint's offsets"
    ids = Counter(r.episode_id for r in records)
    assert max(ids.values()) == 1, "an episode ingested twice"
    on_topic = {
        decode(m.value(), TrajectoryEvent).episode_id
        for m in read_topic(cfg.kafka, TopicNames(cfg.run).trajectories)
        if m.offset() < state["offsets"].get(str(m.partition()), 0)
    }
    assert set(ids) == on_topic
    return state


def published_versions(cfg: Config) -> list[int]:
    return [decode(m.value(), WeightVersionEvent).version for m in read_topic(cfg.kafka, TopicNames(cfg.run).weights)]


def learner_metrics(cfg: Config) -> list[MetricEvent]:
    events = [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics)]
    return [e for e in events if e.role == "learner"]


def _average(rank: int, init: str) -> None:
    """One of two gloo members: both, one, then no member contributes; checked on both."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    group = ProcessGroup(Membership.from_env(), torch.device("cpu"))
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([3.0, 4.0])
    assert group.average_gradients([a, b], True)
    assert a.grad.tolist() == [2.0, 3.0] and b.grad is None  # b had a gradient on no member
    a.grad = torch.tensor([1.0, 2.0]) if rank == 0 else None
    assert group.average_gradients([a, b], rank == 0)
    assert a.grad.tolist() == [1.0, 2.0]  # the zero-weight member does not halve the step
    assert not group.average_gradients([a, b], False)
    assert a.grad is None
    torch.distributed.destroy_process_group()


def test_gradients_are_averaged_over_the_members_that_had_a_batch(tmp_path: Path) -> None:
    torch.multiprocessing.spawn(_average, args=(f"file://{tmp_path / 'rendezvous'}",), nprocs=2)


@pytest.mark.parametrize(
    ("device", "backend", "current"),
    [(torch.device("cuda", 1), "nccl", [torch.device("cuda", 1)]), (torch.device("cpu"), "gloo", [])],
)
def test_a_cuda_member_makes_its_own_gpu_current_and_joins_over_nccl(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, backend: str, current: list[torch.device]
) -> None:
    set_devices: list[torch.device] = []
    backends: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_device", set_devices.append)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda b, **_: backends.append(b))
    group = ProcessGroup(Membership(rank=1, world_size=2, local_rank=1, local_world_size=2), device)
    assert set_devices == current  # before any collective: NCCL binds to the current device
    group.start()
    assert backends == [backend]
    assert set_devices == current


def test_a_members_folder_is_locked_for_one_process(tmp_path: Path) -> None:
    first = MemberLock(tmp_path / "0", "learner member 0 of run 'r'")
    first.acquire()
    with pytest.raises(LearnerError, match=rf"learner member 0 of run 'r' is already running \(pid {os.getpid()}"):
        MemberLock(tmp_path / "0", "learner member 0 of run 'r'").acquire()
    first.release()
    MemberLock(tmp_path / "0", "learner member 0 of run 'r'").acquire()  # free again once released


def test_a_member_whose_agent_is_gone_does_not_start(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {**os.environ, "DISTRL_DATA_DIR": str(tmp_path), "RANK": "1", "WORLD_SIZE": "2", AGENT_PID_ENV: str(gone.pid)}
    member = subprocess.run([CLI, "learn", "--run", "r"], env=env, capture_output=True, text=True, timeout=300)
    assert member.returncode == 1
    lines = member.stderr.strip().splitlines()
    assert len(lines) == 1 and f"learner member 1: the agent that started it (pid {gone.pid}) is gone" in lines[0]
    assert not list(tmp_path.rglob(".lock"))  # refused before it took its member's lock


def test_the_launcher_runs_the_members_with_their_own_options_only() -> None:
    argv = ["distrl-stream", "learn", "--run", "r", "--nproc-per-node", "2", "--max-restarts=5", "--threads", "1"]
    args = member_args(argv)
    assert args == ["--run", "r", "--threads", "1"]
    command = launch_command(2, args, rdzv_endpoint="h:1", max_restarts=5, nnodes="1:3")
    assert {"--nnodes=1:3", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1"} <= set(command)
    assert "--max-restarts=5" in command
    # torchrun would read "--run" as its own abbreviated --run-path without the separator
    assert command[-6:] == ["--", "learn", "--run", "r", "--threads", "1"]


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_two_members_train_one_policy_with_one_writer(group_run: Config, processes: ChildProcesses) -> None:
    cfg = group_run
    agent = processes.start(
        [CLI, "learn", *_learn_args(cfg), "--nproc-per-node", "2", "--max-updates", "6"], _env(cfg), new_session=True
    )
    # Data arrives once both members are in the consumer group: fed earlier, the member that joins first could reach
    # max-updates alone on a slow machine (the other contributing zero-weight batches), and own every partition.
    processes.wait_for("both members assigned", lambda: set(last_assignments(processes.text())) == {"0", "1"})
    produce(cfg, 16, seed=1)
    assert agent.wait(240) == 0, processes.text()[-6000:]

    text = re.sub(r"\s+", " ", processes.text())  # the summary lines are wrapped to the terminal's width
    hashes = re.findall(r"parameters sha256 ([0-9a-f]{64})", text)
    assert len(hashes) == 2 and hashes[0] == hashes[1], text[-3000:]
    # The last assignment each member logged: every partition has exactly one owner.
    last = last_assignments(processes.text())
    assert sorted(last) == ["0", "1"]
    assert sorted(last["0"] + last["1"]) == list(range(PARTITIONS))

    assert published_versions(cfg) == [1, 2, 3]
    final = [e for e in learner_metrics(cfg) if e.labels.get("event") == "final"]
    assert {e.labels["rank"]: e.values["versions_published"] for e in final} == {"0": 3.0, "1": 0.0}
    state = audit(cfg)
    assert state["members"] == 2 and state["updates"] == 6


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_kill_9_of_a_member_restarts_the_group_with_nothing_lost_or_repeated(
    group_run: Config, processes: ChildProcesses
) -> None:
    cfg = group_run
    produce(cfg, 12, seed=2)
    args = [CLI, "learn", *_learn_args(cfg), "--nproc-per-node", "2", "--max-restarts", "2"]
    agent = processes.start(args, _env(cfg), new_session=True)
    processes.wait_for("a checkpoint at update 4", updates_at_least(cfg, 4))
    os.kill(member_pid(cfg, "1"), signal.SIGKILL)
    killed_at = time.monotonic()
    processes.wait_for("the restarted group", lambda: "resumed from ckpt-" in processes.text(), 600)
    produce(cfg, 8, seed=3)
    before = latest_state(cfg)["updates"]  # type: ignore[index]
    processes.wait_for("updates after the restart", updates_at_least(cfg, before + 4))
    print(f"kill -9 -> group updating again: {time.monotonic() - killed_at:.1f}s")
    assert processes.stop(agent) == 0, processes.text()[-6000:]

    audit(cfg)
    versions = published_versions(cfg)
    assert versions == sorted(set(versions)), f"versions repeated or out of order: {versions}"


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_kill_9_of_the_agent_takes_its_members_down_and_a_restart_resumes_with_nothing_lost_or_repeated(
    group_run: Config, processes: ChildProcesses
) -> None:
    cfg = group_run
    produce(cfg, 12, seed=8)
    args = [CLI, "learn", *_learn_args(cfg), "--nproc-per-node", "2"]
    agent = processes.start(args, _env(cfg), new_session=True)
    processes.wait_for("a checkpoint at update 4", updates_at_least(cfg, 4))
    members = {member_pid(cfg, "0"), member_pid(cfg, "1")}
    processes.kill(agent)  # SIGKILL of the agent alone: its members run in sessions of their own
    killed_at = time.monotonic()
    deadline = killed_at + 30
    while any(alive(pid) for pid in members) and time.monotonic() < deadline:
        time.sleep(0.2)
    orphans = {pid for pid in members if alive(pid)}
    for pid in orphans:  # not left training after the test
        os.kill(pid, signal.SIGKILL)
    assert not orphans, f"members {sorted(orphans)} outlived their agent by 30 s"
    print(f"kill -9 of the agent -> members gone: {time.monotonic() - killed_at:.1f}s")

    agent = processes.start(args, _env(cfg), new_session=True)
    processes.wait_for("the restarted group", lambda: processes.text().count("resumed from ckpt-") >= 2, 600)
    produce(cfg, 8, seed=9)
    before = latest_state(cfg)["updates"]  # type: ignore[index]
    processes.wait_for("updates after the restart", updates_at_least(cfg, before + 4))
    assert processes.stop(agent) == 0, processes.text()[-6000:]

    audit(cfg)
    versions = published_versions(cfg)
    assert versions == sorted(set(versions)), f"versions repeated or out of order: {versions}"


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_a_member_joining_a_running_group_rebalances_with_nothing_lost_or_repeated(
    group_run: Config, processes: ChildProcesses
) -> None:
    cfg = group_run
    produce(cfg, 12, seed=4)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"

    def node() -> list[str]:
        # An elastic group of 1 to 2 hosts on one rendezvous; the short last call starts the first host alone.
        agent = launch_command(
            1,
            _learn_args(cfg),
            rdzv_endpoint=endpoint,
            max_restarts=2,
            nnodes="1:2",
            rdzv_conf={"last_call_timeout": "1"},
        )
        return [sys.executable, "-m", "torch.distributed.run", *agent]

    env = {**_env(cfg), **AGENT_ENV}
    first = processes.start(node(), env, new_session=True)
    processes.wait_for("a checkpoint at update 4", updates_at_least(cfg, 4))
    second = processes.start(node(), env, new_session=True)
    processes.wait_for("a group of two", lambda: (latest_state(cfg) or {}).get("members") == 2)
    produce(cfg, 8, seed=5)
    before = latest_state(cfg)["updates"]  # type: ignore[index]
    processes.wait_for("updates of the group of two", updates_at_least(cfg, before + 4))
    for agent in (second, first):
        agent.send_signal(signal.SIGTERM)  # plain torchrun agents: they exit non-zero on a signal, by design
    for agent in (first, second):
        agent.wait(120)
    assert len(re.findall(r"learner \d stopped at update", processes.text())) >= 2, processes.text()[-6000:]

    audit(cfg)
    versions = published_versions(cfg)
    assert versions == sorted(set(versions)), f"versions repeated or out of order: {versions}"


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_a_second_process_with_a_live_members_id_is_refused(group_run: Config, processes: ChildProcesses) -> None:
    cfg = group_run
    produce(cfg, 4, seed=6)
    first = processes.start([CLI, "learn", *_learn_args(cfg)], _env(cfg), new_session=True)
    processes.wait_for("member 0 running", updates_at_least(cfg, 2))
    second = subprocess.run([CLI, "learn", *_learn_args(cfg)], env=_env(cfg), capture_output=True, text=True)
    assert second.returncode != 0
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "learner member 0" in lines[0] and "already running" in lines[0], second.stderr
    assert first.poll() is None
    produce(cfg, 4, seed=7)
    processes.wait_for("member 0 still training", updates_at_least(cfg, 4))
    assert processes.stop(first) == 0, processes.text()[-6000:]
    audit(cfg)
