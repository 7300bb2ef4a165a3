"""A network partition, for real: the broker, the learner, the policy servers (`distrl-stream serve`, vLLM on the tiny
model) and the collectors each on a host of its own (a network namespace on a private bridge, tests/fixtures/netns.py),
sharing nothing but that network, each with its own data dir; then one host's link is cut for a while and healed.

- ``test_a_learner_cut_off_longer_than_its_timeouts_resumes_by_itself`` (``make test``): broker, learner, one
  server, one collector. The learner's link is cut for longer than its producer's message timeout and its consumer's
  group session (lowered to ``MESSAGE_TIMEOUT_S`` and ``SESSION_TIMEOUT_S`` through ``DISTRL_KAFKA__CLIENT``), until
  the learner has given up a version and a metric event and lost its partitions.
- ``test_a_learner_and_then_a_policy_server_cut_off_lose_nothing`` (``make test-cluster``: two vLLM servers beside
  everything else take longer than the default suite's budget): two servers and two collectors; the learner's cut as
  above, then one server's while the other one serves.

After the cuts the collectors and the learner stop cleanly, and the audit checks what each role reported: every
episode a collector reports published is on the topic (none failed, none undelivered, no inference error), and the
learner ingested each exactly once (the ingest log against the topic, tests/learner/test_group.py's ``audit``);
versions are on the topic in increasing order, every number missing among them is one of the versions the learner
reports unannounced (its final metrics also count the metric events it lost), and every step acted by a trained
version names the adapter sha256 published for it; the learner resumed by itself (a version published after the
heal, served by every server, and everything collected ingested); the collectors failed over (steps of episodes
begun during a server's cut came from the other server; each collector counts failovers away from it).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from distrl_stream.config import Config, load_config
from distrl_stream.events import MetricEvent, TrajectoryEvent, WeightVersionEvent, decode
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from tests.fixtures.netns import Host, Network, start_broker
from tests.fixtures.processes import CLI, ChildProcesses
from tests.learner.test_group import audit
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.netns]

MESSAGE_TIMEOUT_S = 4  # the learner's producer gives a message up after this long (librdkafka message.timeout.ms)
SESSION_TIMEOUT_S = 6  # the learner's consumer loses its partitions after this long (the broker's minimum)
REQUEST_TIMEOUT_S = 20  # a collector's request to a server that is cut off fails after this long
SERVER_PORT = 8000  # + the server's index: hosts share this machine's hostname, and a server's metrics name it by port
METRICS_PORT = 9100  # every role's Prometheus endpoint, on its own host
# The learner's counters of the records it used, whatever became of them (ingested, dropped, dead-lettered).
USED = ("distrl_learner_trajectories_total", "distrl_learner_dlq_records_total")


def _newest_listed(url: str) -> int:
    """The newest version a server lists (-1 when it does not answer)."""
    try:
        models = httpx.get(f"{url}/v1/models", timeout=5.0).json()["data"]
    except httpx.HTTPError:
        return -1
    return max((int(m["id"].rsplit("-v", 1)[1]) for m in models), default=-1)


class Run:
    """A run whose roles each run on a host of their own, and what the test reads of it."""

    def __init__(
        self,
        network: Network,
        processes: ChildProcesses,
        tmp_path: Path,
        cfg: Config,
        servers: list[Host],
        collectors: list[Host],
        learner: Host,
    ) -> None:
        self.network = network
        self.processes = processes
        self.tmp_path = tmp_path
        self.cfg = cfg
        self.topics = TopicNames(cfg.run)
        self.learner_host = learner
        self.server_hosts = servers
        self.collector_hosts = collectors
        self.urls = [f"http://{h.address}:{SERVER_PORT + i}" for i, h in enumerate(servers)]
        self.learner: subprocess.Popen[bytes] | None = None
        self.collectors: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "DISTRL_MODEL__BASE": str(cfg.model.base),
            "DISTRL_ENV__TEMPLATES": '["alarm_on"]',
            "DISTRL_INFERENCE__REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
            "DISTRL_LEARNER__BATCH_EPISODES": "4",
            "DISTRL_LEARNER__MIN_BUFFER_EPISODES": "4",
            "DISTRL_LEARNER__UPDATES_PER_VERSION": "2",
            "DISTRL_LEARNER__PRIORITY_REFRESH_INTERVAL": "1000",
            # A checkpoint, and its commit, at every version: a cut always catches one.
            "DISTRL_LEARNER__CHECKPOINT_INTERVAL_UPDATES": "2",
            "DISTRL_LEARNER__METRICS_INTERVAL_S": "1",
            "DISTRL_COLLECTOR__VERSION_REFRESH_S": "0.5",
            "DISTRL_COLLECTOR__SHUTDOWN_GRACE_S": "10",
        }

    def start(self, host: Host, args: list[str], *, report: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        """``distrl-stream ARGS`` on ``host``, with a data dir of its own and its metrics at ``METRICS_PORT``."""
        role = [CLI, *args, "--run", self.cfg.run, "--bootstrap-servers", self.cfg.kafka.bootstrap_servers]
        if args[0] != "serve":  # the server's metrics would be its weight watcher's
            role += ["--metrics-port", str(METRICS_PORT)]
        env = {**self.env, "DISTRL_DATA_DIR": str(self.tmp_path / host.name), **env}
        return self.processes.start(host.command(role), env, report=report)

    def start_roles(self) -> None:
        """The servers and the learner, then (once the servers answer) the collectors, spread over every server."""
        for i, host in enumerate(self.server_hosts):
            self.start(host, ["serve", "--host", host.address, "--port", str(SERVER_PORT + i)])
        timeout = json.dumps(
            {"message.timeout.ms": str(MESSAGE_TIMEOUT_S * 1000), "session.timeout.ms": str(SESSION_TIMEOUT_S * 1000)}
        )
        self.learner = self.start(self.learner_host, ["learn", "--threads", "1"], DISTRL_KAFKA__CLIENT=timeout)
        self.processes.wait_for("the servers", lambda: min(map(_newest_listed, self.urls)) >= 0, 420)
        servers = [flag for url in self.urls for flag in ("--inference-url", url)]
        for host in self.collector_hosts:
            command = ["collect", "--envs", "4", "--collector-id", host.name, "--json", *servers]
            self.collectors[host.name] = self.start(host, command, report=host.name)

    # -- what the topics say ---------------------------------------------------------------------------------------

    def trajectories(self) -> list[TrajectoryEvent]:
        return [decode(m.value(), TrajectoryEvent) for m in read_topic(self.cfg.kafka, self.topics.trajectories)]

    def versions(self) -> list[WeightVersionEvent]:
        """The weight events in the order they are on the topic."""
        return [decode(m.value(), WeightVersionEvent) for m in read_topic(self.cfg.kafka, self.topics.weights)]

    def newest(self) -> int:
        return max((e.version for e in self.versions()), default=0)

    def metrics(self, role: str) -> list[MetricEvent]:
        events = (decode(m.value(), MetricEvent) for m in read_topic(self.cfg.kafka, self.topics.metrics))
        return [e for e in events if e.role == role]

    def used(self) -> int:
        """Records of the topic the learner has used, whatever became of them (-1 while it does not answer)."""
        try:
            samples = scrape(f"{self.learner_host.address}:{METRICS_PORT}")
        except httpx.HTTPError:
            return -1
        return int(sum(s.value for s in samples if s.name in USED))

    def served_everywhere(self, version: int) -> bool:
        return all(_newest_listed(url) >= version for url in self.urls)

    def loaded(self) -> dict[str, list[int]]:
        """Server -> the versions it reported loaded, in order (it reports nothing else unless it refused one)."""
        loaded: dict[str, list[int]] = {}
        for metric in self.metrics("inference"):
            assert metric.labels.get("event") == "loaded", metric.labels
            loaded.setdefault(metric.source_id, []).append(int(metric.values["policy_version"]))
        return loaded

    # -- the partitions --------------------------------------------------------------------------------------------

    def cut_learner(self) -> None:
        """Cut the learner off until it gave up a version and a metric event (each after its message timeout) and lost
        its partitions (after its session timeout), heal; then wait until it publishes again, every server serves that,
        and it used what was collected meanwhile."""
        before = self.newest()
        seen = len(self.processes.text())
        self.network.cut(self.learner_host)
        cut_at = time.monotonic()

        def gave_up() -> bool:
            log = self.processes.text()[seen:]
            return all(
                line in log for line in ("a version was not announced", "a metric event was lost", "lost partitions")
            )

        self.processes.wait_for("the learner to give a version and a metric event and its partitions up", gave_up, 60)
        self.network.heal(self.learner_host)
        cut_s = time.monotonic() - cut_at
        on_topic = len(self.trajectories())

        # Any version above `before` was published after the heal (the one the cut caught was given up). Waiting
        # for the newest to be served everywhere would chase a learner that publishes faster than servers load.
        def resumed() -> bool:
            return self.served_everywhere(before + 1) and self.used() >= on_topic

        self.processes.wait_for("a version published after the heal, served everywhere", resumed, 240)
        print(f"learner cut off for {cut_s:.0f} s; back {time.monotonic() - cut_at - cut_s:.0f} s after the heal")

    def cut_server(self, index: int) -> None:
        """Cut server ``index`` off while the others serve until each collector delivered an episode begun after
        the cut (and for longer than a request's timeout); heal; wait until it serves the version newest at the heal and
        answers a collector's request."""
        host, url = self.server_hosts[index], self.urls[index]
        self.network.cut(host)
        cut_at, cut_wall = time.monotonic(), datetime.now(UTC)

        def begun_after(moment: datetime) -> list[TrajectoryEvent]:
            return [e for e in self.trajectories() if e.started_at > moment]

        def collected_without_it() -> bool:
            by = {e.collector_id for e in begun_after(cut_wall)}
            return by == {h.name for h in self.collector_hosts} and time.monotonic() - cut_at > REQUEST_TIMEOUT_S + 5

        self.processes.wait_for(f"episodes collected while {host.name} is cut off", collected_without_it, 180)
        during = begun_after(cut_wall)  # and ended: they are on the topic
        self.network.heal(host)
        healed, newest_at_heal = datetime.now(UTC), self.newest()
        cut_s = time.monotonic() - cut_at
        assert all(s.server != url for e in during for s in e.steps)

        def back() -> bool:
            return self.served_everywhere(newest_at_heal) and any(
                s.server == url for e in begun_after(healed) for s in e.steps
            )

        self.processes.wait_for(f"{host.name} serving again", back, 240)
        print(
            f"{host.name} cut off for {cut_s:.0f} s, {len(during)} episodes collected by the others meanwhile; "
            f"back {time.monotonic() - cut_at - cut_s:.0f} s after the heal"
        )

    # -- the end ---------------------------------------------------------------------------------------------------

    def stop_and_audit(self) -> dict[str, dict[str, float | None]]:
        """Stop the collectors and the learner cleanly, then check what each reported against the topics.

        Returns:
            Collector -> server URL -> requests that failed on that server and moved on to another.
        """
        assert self.learner is not None
        scraped = {
            name: scrape(f"{h.address}:{METRICS_PORT}")
            for name, h in zip(self.collectors, self.collector_hosts, strict=True)
        }
        for proc in self.collectors.values():
            assert self.processes.stop(proc) == 0, self.processes.tail()
        reports = {name: self.processes.report(name) for name in self.collectors}
        events = self.trajectories()
        self.processes.wait_for("the learner to use every episode", lambda: self.used() == len(events), 120)
        assert self.processes.stop(self.learner, 180) == 0, self.processes.tail()
        newest = self.newest()

        def all_loaded() -> bool:
            loaded = self.loaded()
            return len(loaded) == len(self.urls) and all(v[-1] == newest for v in loaded.values())

        self.processes.wait_for("every server to load the last version", all_loaded, 120)

        # Collectors: every episode reported published is on the topic, once.
        assert len({e.episode_id for e in events}) == len(events)
        for name, report in reports.items():
            assert report["publish_failures"] == report["undelivered"] == 0, report
            assert report["by_termination"].get("inference_error", 0) == 0, report
            assert report["published"] == report["delivered"] == sum(e.collector_id == name for e in events), report
        # The learner: each episode ingested exactly once, nothing left out.
        state = audit(self.cfg)
        assert sum(state["offsets"].values()) == len(events)
        # Versions in order; a number missing is one the learner reports unannounced; every step names its adapter.
        published = self.versions()
        numbers = [e.version for e in published]
        assert numbers == sorted(set(numbers)), numbers
        final = [m for m in self.metrics("learner") if m.labels.get("event") == "final"][-1].values
        unannounced, metrics_lost = int(final["versions_unannounced"]), int(final["metric_events_lost"])
        missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
        assert unannounced >= 1 and metrics_lost >= 1 and len(missing) <= unannounced, (missing, final)
        sha256 = {e.version: e.sha256 for e in published}
        steps = [s for e in events for s in e.steps if s.policy_version > 0]
        assert all(s.adapter_sha256 == sha256[s.policy_version] for s in steps)
        # Servers: each refused none (loaded() checks) and loaded published versions in increasing order.
        loaded = self.loaded()
        assert all(v == sorted(set(v)) and set(v) <= set(numbers) for v in loaded.values()), loaded
        failovers = {
            name: {url: value(samples, "distrl_collector_server_failovers_total", server=url) for url in self.urls}
            for name, samples in scraped.items()
        }
        print(
            f"{len(events)} episodes, all ingested once; versions {numbers} ({missing} never announced); "
            f"learner lost {unannounced} versions and {metrics_lost} metric events; servers loaded {loaded}; "
            f"collectors: {[(n, r['published'], r['delivered'], r['publish_failures']) for n, r in reports.items()]}, "
            f"failovers {failovers}"
        )
        return failovers


@pytest.fixture
def partitioned_run(
    network: Network,
    processes: ChildProcesses,
    tmp_path: Path,
    tiny_model_dir: Path,
    kafka_home: Path,
    unique_name: Callable[[str], str],
) -> Callable[[int, int], Run]:
    """Factory: a run with a broker, a learner, ``servers`` servers and ``collectors`` collectors, each on its host."""

    def make(servers: int, collectors: int) -> Run:
        broker = network.host("broker")
        learner = network.host("learner")
        server_hosts = [network.host(f"server{i}") for i in range(servers)]
        collector_hosts = [network.host(f"c{i}") for i in range(collectors)]
        bootstrap = start_broker(broker, tmp_path / "broker", kafka_home)
        cfg = load_config(
            None,
            run=unique_name("partition"),
            data_dir=tmp_path / "learner",  # the learner's: the audit reads its ingest log and checkpoints
            kafka={"bootstrap_servers": bootstrap},
            model={"base": tiny_model_dir},
        )
        ensure_run_topics(cfg)
        run = Run(network, processes, tmp_path, cfg, server_hosts, collector_hosts, learner)
        run.start_roles()
        processes.wait_for("version 2 served", lambda: run.newest() >= 2 and run.served_everywhere(2), 300)
        return run

    return make


@pytest.mark.timeout(600)
def test_a_learner_cut_off_longer_than_its_timeouts_resumes_by_itself(
    partitioned_run: Callable[[int, int], Run],
) -> None:
    run = partitioned_run(1, 1)
    run.cut_learner()
    run.stop_and_audit()


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_learner_and_then_a_policy_server_cut_off_lose_nothing(partitioned_run: Callable[[int, int], Run]) -> None:
    run = partitioned_run(2, 2)
    run.cut_learner()
    run.cut_server(0)
    failovers = run.stop_and_audit()
    # Each collector moved requests off the server while it was cut off.
    assert all((moved[run.urls[0]] or 0) >= 1 for moved in failovers.values()), failovers
