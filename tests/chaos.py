"""The chaos soak (issue 32): a whole run while a seeded schedule SIGKILLs one role after another, each restarted as
an operator's supervisor would, then audited as the group-fault tests audit.

The roles are the real CLIs: a learner group (``learn --nproc-per-node 2`` under torch's elastic agent), collectors
(``collect``), and either policy servers of the soak's own (``serve``, vLLM with its weight watcher) or servers given
by the caller (not faulted). A fault kills one of:

- ``agent``: the learner's elastic agent (its members end themselves); restarted with the same command;
- ``member``: one learner member; the agent restarts the group (``--max-restarts``), as it would in production;
- ``collector``: a collector; restarted under a new collector id (``collect`` without ``--collector-id`` names
  itself ``<host>-<pid>``, so a supervisor's restart is a new collector), its last scrape taken just before the kill;
- ``server``: a ``serve`` process (its vLLM dies with it); restarted on the same port once the port is free, never
  while another server is down (the collectors fail over to the others);
- ``broker``: one node of the 3-node cluster; restarted after a supervisor's delay.

The schedule (:func:`schedule`) is drawn from ``random.Random(seed)``: kinds in shuffled rounds of every kind given,
so each appears as often as the others, a victim among those of its kind, and a gap before each fault. The next
fault never comes before the previous victim is back, but for a server: its vLLM takes minutes to start on busy
cores, and only the next server fault and the end wait for it.

The audit (:meth:`Soak.finish`), after the survivors stopped cleanly: every episode a surviving collector reports
published is on ``{run}.trajectories`` (a killed collector's are what is there under its id) and none is there
twice; the learner ingested each exactly once (``tests/learner/test_group.py``'s ``audit``); versions on
``{run}.weights`` strictly increase and one came after the last fault; every step acted by a trained version names the
adapter sha256 published for it; no record is dead-lettered twice by one consumer; and each role's report says what it
lost. The figures come back as a dict for ``bench/results/chaos.json``; ``violations`` lists what the audit found.

``tests/test_chaos.py`` runs it (a short variant in ``make test``, the full one in ``make test-cluster``), and so
does ``bench/chaos.py``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from distrl_stream.config import Config
from distrl_stream.events import DeadLetter, MetricEvent, TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.inference.client import served_name
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.broker import EmbeddedCluster
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames
from distrl_stream.processes import free_port, port_free
from tests.fixtures.processes import CLI, ChildProcesses
from tests.learner.test_group import alive, audit, latest_state, member_pid
from tests.monitor.scrape import scrape, value

KINDS = ("agent", "member", "collector", "server", "broker")
MEMBERS = 2
SUPERVISOR_RESTART_DELAY_S = 5.0  # systemd's RestartSec / a kubelet's first back-off, about
MEMBERS_OUTLIVE_AGENT_S = 30.0  # how long a member may outlive its agent (test_group's agent test allows as much)
SERVER_START_S = 900.0  # a vLLM start on two cores busy with everything else (300 s was seen not to be enough)

ROLE_ENV = {
    "DISTRL_ENV__TEMPLATES": '["alarm_on"]',
    "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": "20",
    "DISTRL_INFERENCE__STARTUP_TIMEOUT_S": str(int(SERVER_START_S)),
    "DISTRL_LEARNER__BATCH_EPISODES": "4",
    "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "4",
    "DISTRL_LEARNER__UPDATES_PER_VERSION": "2",
    "DISTRL_LEARNER__CHECKPOINT_INTERVAL_UPDATES": "2",
    "DISTRL_LEARNER__PRIORITY_REFRESH_INTERVAL": "1000",
    "DISTRL_LEARNER__METRICS_INTERVAL_S": "1",
    "DISTRL_LEARNER__THREADS": "1",
    "DISTRL_LEARNER__DROP_ABOVE_POLICY_LAG": "1000",  # every episode counts as ingested for the audit
    "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
    "DISTRL_COLLECTOR__SHUTDOWN_GRACE_S": "10",
}


@dataclass(frozen=True)
class Fault:
    """One scheduled kill: ``gap_s`` after the previous fault (never before its victim is back), ``kind``'s
    ``target``-th victim (a collector or server slot, a member rank, a broker index)."""

    kind: str
    target: int
    gap_s: float


def schedule(seed: int, faults: int, victims: Mapping[str, int], gap_s: tuple[float, float]) -> list[Fault]:
    """``faults`` faults drawn from ``random.Random(seed)``: the kinds of ``victims`` (kind -> how many there are)
    in shuffled rounds, a victim of its kind and a gap in ``gap_s`` each."""
    rng = random.Random(seed)
    drawn: list[Fault] = []
    while len(drawn) < faults:
        kinds = sorted(victims)
        rng.shuffle(kinds)
        for kind in kinds[: faults - len(drawn)]:
            drawn.append(Fault(kind, rng.randrange(victims[kind]), round(rng.uniform(*gap_s), 1)))
    return drawn


def _listed(url: str) -> set[str]:
    try:
        return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5.0).json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return set()


class Soak:
    """A run of real roles that faults are injected into, and its audit.

    Args:
        cfg: the run (its ``data_dir`` is the learner's: the audit reads its checkpoints and ingest logs).
        processes: where the roles run (their output in one log; every one stopped by its owner at the end).
        root: a folder for the servers' and collectors' own data dirs.
        collectors: how many collectors run at a time.
        servers: how many ``serve`` processes the soak starts (and may kill); 0 uses ``inference_urls``.
        inference_urls: servers the caller runs, never faulted (their weight watchers are the caller's).
        cluster: the nodes ``broker`` faults kill, when the run is on an :class:`EmbeddedCluster`.
    """

    def __init__(
        self,
        cfg: Config,
        processes: ChildProcesses,
        root: Path,
        *,
        collectors: int = 2,
        servers: int = 0,
        inference_urls: Sequence[str] = (),
        cluster: EmbeddedCluster | None = None,
    ) -> None:
        if not servers and not inference_urls:
            raise ValueError("give the soak servers to start or the URLs of running ones")
        self.cfg = cfg
        self.processes = processes
        self.root = root
        self.cluster = cluster
        self.slots = collectors
        self.topics = TopicNames(cfg.run)
        self.ports = [free_port() for _ in range(servers)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports] or list(inference_urls)
        self.env = {**os.environ, **ROLE_ENV, "DISTRL_MODEL__BASE": str(cfg.model.base)}
        if cluster is not None:
            self.env["DISTRL_KAFKA__REPLICATION_FACTOR"] = str(min(cluster.size, 3))
        self.servers: list[subprocess.Popen[bytes]] = []
        self.collectors: list[tuple[str, subprocess.Popen[bytes], int]] = []  # id, process, metrics port
        self.incarnations = Counter[int]()
        self.killed_collectors: dict[str, dict[str, float]] = {}  # id -> its last scrape before the kill
        self.agent: subprocess.Popen[bytes] | None = None
        self.injected: list[dict[str, Any]] = []
        self.started = time.monotonic()

    # -- roles -----------------------------------------------------------------------------------------------------

    def _cli(self, args: list[str], data_dir: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
        run = ["--run", self.cfg.run, "--bootstrap-servers", self.cfg.kafka.bootstrap_servers]
        return self.processes.start([CLI, *args, *run], {**self.env, "DISTRL_DATA_DIR": str(data_dir)}, **kwargs)

    def _start_server(self, i: int) -> subprocess.Popen[bytes]:
        return self._cli(["serve", "--watch", "--port", str(self.ports[i])], self.root / f"server{i}")

    def _server_up(self, i: int) -> bool:
        return served_name(self.cfg.model.policy_id, 0) in _listed(self.urls[i])

    def _start_agent(self) -> subprocess.Popen[bytes]:
        args = ["learn", "--threads", "1", "--nproc-per-node", str(MEMBERS), "--max-restarts", "1000"]
        return self._cli(args, self.cfg.data_dir, new_session=True)

    def _start_collector(self, slot: int) -> tuple[str, subprocess.Popen[bytes], int]:
        self.incarnations[slot] += 1
        name, port = f"c{slot}-{self.incarnations[slot]}", free_port()
        servers = [flag for url in self.urls for flag in ("--inference-url", url)]
        args = ["collect", "--envs", "4", "--collector-id", name, "--json", "--metrics-port", str(port), *servers]
        return name, self._cli(args, self.root / name, report=name), port

    def _resumed(self) -> int:
        return self.processes.text().count("resumed from ckpt-")

    def newest(self) -> int:
        return max((e.version for e in self.versions()), default=0)

    def start(self, *, versions: int = 1) -> None:
        """Start every role and wait until ``versions`` versions are published: the learner has checkpointed, so
        a learner fault has something to resume from."""
        self.servers = [self._start_server(i) for i in range(len(self.ports))]
        self.agent = self._start_agent()
        self.processes.wait_for("the servers", self._servers_up, SERVER_START_S)
        self.collectors = [self._start_collector(slot) for slot in range(self.slots)]
        self.processes.wait_for(f"version {versions} published", lambda: self.newest() >= versions, 600)
        self.started = time.monotonic()

    # -- faults ----------------------------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Kill ``fault``'s victim and restart it as a supervisor would; return once it is back."""
        killed_at = time.monotonic()
        detail = getattr(self, f"_kill_{fault.kind}")(fault.target)
        self.injected.append(
            {
                **asdict(fault),
                "at_s": round(killed_at - self.started, 1),
                "back_after_s": round(time.monotonic() - killed_at, 1),
                "victim": detail,
            }
        )
        print(f"fault {len(self.injected)}: {self.injected[-1]}", flush=True)

    def _kill_agent(self, _target: int) -> str:
        assert self.agent is not None
        members = {member_pid(self.cfg, str(rank)) for rank in range(MEMBERS)}
        resumed, pid = self._resumed(), self.agent.pid
        self.processes.kill(self.agent)
        self.processes.wait_for(
            "the members to end with their agent",
            lambda: not any(alive(pid) for pid in members),
            MEMBERS_OUTLIVE_AGENT_S,
        )
        time.sleep(SUPERVISOR_RESTART_DELAY_S)
        self.agent = self._start_agent()
        self.processes.wait_for("the restarted group", lambda: self._resumed() >= resumed + MEMBERS, 600)
        return f"agent (pid {pid})"

    def _kill_member(self, rank: int) -> str:
        pid, resumed = member_pid(self.cfg, str(rank)), self._resumed()
        os.kill(pid, signal.SIGKILL)
        self.processes.wait_for("the group restarted by its agent", lambda: self._resumed() >= resumed + MEMBERS, 600)
        return f"member {rank} (pid {pid})"

    def _kill_collector(self, slot: int) -> str:
        name, proc, port = self.collectors[slot]
        samples = scrape(f"127.0.0.1:{port}")
        self.processes.kill(proc)
        self.killed_collectors[name] = {
            "published": value(samples, "distrl_collector_trajectories_published_total") or 0.0,
            "delivered": value(samples, "distrl_collector_trajectories_delivered_total") or 0.0,
            "in_flight": value(samples, "distrl_collector_episodes_in_flight") or 0.0,
        }
        time.sleep(SUPERVISOR_RESTART_DELAY_S)
        self.collectors[slot] = self._start_collector(slot)
        return f"collector {name}"

    def _servers_up(self) -> bool:
        return all(self._server_up(i) for i in range(len(self.ports)))

    def _kill_server(self, i: int) -> str:
        # Never both at once: the collectors fail over to the other one. A vLLM start takes minutes on busy cores, so
        # other kinds of fault go on meanwhile; only the next server fault (and the end) waits for it.
        self.processes.wait_for("every server up", self._servers_up, SERVER_START_S)
        port = self.ports[i]
        self.processes.kill(self.servers[i])
        # vLLM gets the parent-death signal; the port is free once it is gone.
        self.processes.wait_for(f"port {port} free", lambda: port_free(port), 120)
        time.sleep(SUPERVISOR_RESTART_DELAY_S)
        self.servers[i] = self._start_server(i)
        return f"server {i} (port {port}), restarted"

    def _kill_broker(self, index: int) -> str:
        assert self.cluster is not None
        node = self.cluster.nodes[index]
        node.kill()
        time.sleep(SUPERVISOR_RESTART_DELAY_S)
        node.start()  # waits until it answers
        return f"broker node {index + 1}"

    def run(self, faults: Sequence[Fault], min_duration_s: float) -> None:
        """Inject ``faults`` on their schedule, then run on (at least ``min_duration_s`` since :meth:`start`) until a
        version is published after the last one."""
        last = time.monotonic()
        for fault in faults:
            at = last + fault.gap_s
            self.processes.wait_for(f"the gap before fault {fault}", lambda at=at: time.monotonic() >= at, 3600)
            last = time.monotonic()
            self.inject(fault)
        after = self.newest()
        self.processes.wait_for("a version after the last fault", lambda: self.newest() > after, 600)
        self.processes.wait_for("every server up", self._servers_up, SERVER_START_S)
        end = self.started + min_duration_s
        self.processes.wait_for("the soak's duration", lambda: time.monotonic() >= end, min_duration_s + 60)

    # -- the audit -------------------------------------------------------------------------------------------------

    def trajectories(self) -> list[TrajectoryEvent]:
        return [decode(m.value(), TrajectoryEvent) for m in read_topic(self.cfg.kafka, self.topics.trajectories)]

    def versions(self) -> list[WeightVersionEvent]:
        return [decode(m.value(), WeightVersionEvent) for m in read_topic(self.cfg.kafka, self.topics.weights)]

    def metrics(self, role: str) -> list[MetricEvent]:
        events = (decode(m.value(), MetricEvent) for m in read_topic(self.cfg.kafka, self.topics.metrics))
        return [e for e in events if e.role == role]

    def finish(self, seed: int) -> dict[str, Any]:
        """Stop every role cleanly (collectors, the learner once it checkpointed past every trajectory, the servers)
        and audit the run; the result's ``violations`` lists what the audit found (empty: nothing lost or doubled)."""
        assert self.agent is not None
        duration_s = time.monotonic() - self.started
        reports: dict[str, dict[str, Any]] = {}
        for name, proc, _port in self.collectors:
            code = self.processes.stop(proc)
            assert code == 0, f"collector {name} exited {code}:\n{self.processes.tail()}"
            reports[name] = self.processes.report(name)  # type: ignore[assignment]
        admin = Admin(self.cfg.kafka)
        ends = {p.partition: p.high for p in admin.describe_topic(self.topics.trajectories).partitions}

        def caught_up() -> bool:
            offsets = (latest_state(self.cfg) or {}).get("offsets", {})
            return all(offsets.get(str(p), 0) >= end for p, end in ends.items())

        self.processes.wait_for("the learner to checkpoint past every trajectory", caught_up, 600)
        code = self.processes.stop(self.agent, 180)
        assert code == 0, f"the learner exited {code}:\n{self.processes.tail()}"
        for proc in self.servers:
            self.processes.stop(proc)
        return self._audit(seed, duration_s, reports)

    def _audit(self, seed: int, duration_s: float, reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        violations: list[str] = []

        def check(ok: bool, what: str) -> None:
            if not ok:
                violations.append(what)

        events = self.trajectories()
        on_topic = Counter(e.episode_id for e in events)
        by_collector = Counter(e.collector_id for e in events)
        doubled_on_topic = sum(n - 1 for n in on_topic.values())
        check(doubled_on_topic == 0, f"{doubled_on_topic} episodes more than once on the topic")
        # Survivors: what each reports published is on the topic; what it reports lost is counted.
        missing = 0
        lost = Counter[str]()
        for name, report in reports.items():
            missing += max(int(report["delivered"]) - by_collector[name], 0)
            held = f"{name} reports {report['delivered']} delivered, the topic holds {by_collector[name]}"
            check(report["delivered"] == by_collector[name], held)
            lost["collector_publish_failures"] += int(report["publish_failures"])
            lost["collector_undelivered"] += int(report["undelivered"])
            lost["collector_abandoned_at_stop"] += len(report["abandoned_ids"])
        # Killed collectors: in flight at the kill, and handed to their producer but never on the topic.
        for name, scraped in self.killed_collectors.items():
            lost["collector_in_flight_at_kill"] += int(scraped["in_flight"])
            lost["collector_unacknowledged_at_kill"] += max(int(scraped["published"]) - by_collector[name], 0)
        lost["episodes_missing"] = missing
        # The learner: each episode on the topic ingested exactly once.
        ingested_twice = 0
        try:
            state = audit(self.cfg)
            check(sum(state["offsets"].values()) == len(events), "trajectories on the topic the learner never read")
        except AssertionError as exc:
            violations.append(f"ingest audit: {exc}")
            ingested_twice = -1  # unknown: the audit stopped at its first failure
        # Every member that stopped cleanly (the last group, and those an agent stopped to restart the group) reports
        # its losses in a final metric event; a killed one reports nothing, and its successor redoes its work.
        final = [m for m in self.metrics("learner") if m.labels.get("event") == "final"]
        for metric in final:
            for key in ("versions_unannounced", "metric_events_lost", "dead_letters_lost"):
                lost[f"learner_{key}"] += int(metric.values[key])
        # Versions strictly increase, a version came after the last fault, every step names its adapter's sha256.
        published = self.versions()
        numbers = [e.version for e in published]
        check(numbers == sorted(set(numbers)), f"versions out of order or repeated: {numbers}")
        sha256 = {e.version: e.sha256 for e in published}
        steps = [s for e in events for s in e.steps if s.policy_version > 0]
        wrong = [(s.server, s.policy_version) for s in steps if s.adapter_sha256 != sha256.get(s.policy_version)]
        check(not wrong, f"{len(wrong)} steps name an adapter not published for their version: {wrong[:5]}")
        loaded = Counter[str]()
        for metric in self.metrics("inference"):
            if metric.labels.get("event") == "loaded":
                loaded[metric.source_id] += 1
                version = int(metric.values["policy_version"])
                check(version in sha256, f"{metric.source_id} loaded v{version}, never published")
            else:
                violations.append(f"{metric.source_id} refused a version: {metric.labels}")
        # Dead letters: no record twice by one consumer.
        letters = Counter(
            (d.consumer, d.topic, d.partition, d.offset)
            for d in (decode(m.value(), DeadLetter) for m in read_topic(self.cfg.kafka, self.topics.dlq))
        )
        doubled_letters = sum(n - 1 for n in letters.values())
        check(doubled_letters == 0, f"{doubled_letters} records dead-lettered twice")
        faults = Counter(f["kind"] for f in self.injected)
        return {
            "name": "chaos",
            "seed": seed,
            "passed": not violations,
            "violations": violations,
            "metrics": {
                "seed": seed,
                "duration_s": round(duration_s, 1),
                "faults": {"total": len(self.injected), **{kind: faults[kind] for kind in KINDS if kind in faults}},
                "episodes": len(events),
                "episodes_by_survivors": sum(int(r["delivered"]) for r in reports.values()),
                "episodes_by_killed_collectors": sum(by_collector[name] for name in self.killed_collectors),
                "episodes_ended_by_inference_errors": sum(
                    int(r["by_termination"].get("inference_error", 0)) for r in reports.values()
                ),
                "lost": dict(lost),
                "doubled": {"on_topic": doubled_on_topic, "ingested": ingested_twice, "dead_letters": doubled_letters},
                "versions": len(numbers),
                "steps_by_trained_versions": len(steps),
                "adapters_loaded_by_server": dict(loaded),
                "dead_letters": sum(letters.values()),
                "cpu_count": os.cpu_count(),
                "loadavg_end": list(os.getloadavg()),
            },
            "schedule": self.injected,
        }


def run_soak(
    soak: Soak,
    *,
    seed: int,
    faults: int,
    kinds: Sequence[str],
    gap_s: tuple[float, float],
    min_duration_s: float,
) -> dict[str, Any]:
    """Start ``soak``'s roles, inject ``faults`` faults of ``kinds`` drawn from ``seed``, stop and audit."""
    victims = {
        "agent": 1,
        "member": MEMBERS,
        "collector": soak.slots,
        "server": len(soak.ports),
        "broker": soak.cluster.size if soak.cluster is not None else 0,
    }
    unavailable = [k for k in kinds if not victims[k]]
    if unavailable:
        raise ValueError(f"nothing to kill for {unavailable}: give the soak servers of its own and a cluster")
    drawn = schedule(seed, faults, {k: victims[k] for k in kinds}, gap_s)
    soak.start()
    soak.run(drawn, min_duration_s)
    return soak.finish(seed)
