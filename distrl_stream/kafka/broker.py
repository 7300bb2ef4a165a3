"""The embedded broker: one Apache Kafka JVM in KRaft mode (broker and controller), run from a Kafka installation.

Everything lives in one run directory, so data survives restarts and any process can find the broker::

    run_dir/
      server.properties   log4j2.properties   generated on every start
      data/               log.dirs, formatted once (its meta.properties holds the cluster id)
      logs/broker.log     the broker's log (rotated at 10 MB);  logs/jvm.out: the JVM's stdout/stderr
      broker.json         state: pid, ports, cluster id, installation; read by `kafka status` / `kafka stop`

Ports are picked free on the first start and reused on later starts while they stay free, so the bootstrap address
is stable across restarts.

:class:`EmbeddedCluster` runs several such brokers as one KRaft cluster on this machine (every node is broker and
controller, each with its own run directory under the cluster's), so a test or a user can see what a replicated
cluster does when a broker dies.

By default the client listener is PLAINTEXT on loopback. With a :class:`BrokerSecurity` it is SASL_SSL instead: TLS
from PEM files and SCRAM users created when the storage is formatted (docs/kafka.md, "A secured cluster").
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException

from distrl_stream.config import Config, KafkaConfig
from distrl_stream.errors import BrokerError
from distrl_stream.kafka.admin import Admin
from distrl_stream.kafka.install import find_kafka_home, installation_name
from distrl_stream.processes import LOG_TAIL_LINES, ChildProcess, free_port, log_tail, port_free, signal_group

log = logging.getLogger(__name__)

STATE_FILE = "broker.json"
CLUSTER_FILE = "cluster.json"
_START_ATTEMPTS = 3  # a freshly picked free port can be taken by someone else before the JVM binds it


@dataclass(frozen=True, slots=True)
class BrokerState:
    """What ``broker.json`` records about the broker of a run directory."""

    pid: int | None
    port: int
    controller_port: int
    cluster_id: str
    kafka_home: str
    installation: str
    started_at: str | None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerSecurity:
    """A SASL_SSL client listener: TLS with PEM files, SCRAM authentication, brokers talking to each other over it.

    Users are created when the storage is formatted (``StorageTool format --add-scram``): on the first start of a
    run directory only, so later starts keep the users it was formatted with.

    Args:
        keystore: PEM file with the broker's private key (unencrypted PKCS#8) followed by its certificate chain; the
            certificate must name the address clients connect to (``IP:127.0.0.1`` for the embedded broker).
        truststore: PEM file with the CA certificate(s) clients and brokers trust.
        users: SCRAM user -> password.
        inter_broker_user: the user brokers (and :meth:`EmbeddedBroker.start`'s readiness check) log in as; one of
            ``users``.
        mechanism: ``SCRAM-SHA-512`` or ``SCRAM-SHA-256``.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str] = field(repr=False)
    inter_broker_user: str = "admin"
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        if self.inter_broker_user not in self.users:
            raise BrokerError(f"inter_broker_user {self.inter_broker_user!r} is not one of the SCRAM users")
        if self.mechanism not in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            raise BrokerError(f"mechanism must be SCRAM-SHA-512 or SCRAM-SHA-256, got {self.mechanism!r}")

    def client_properties(self, user: str, password: str | None = None) -> dict[str, str]:
        """The librdkafka properties (``kafka.client``) of a client logging in as ``user``.

        Args:
            user: the SCRAM user.
            password: its password; default: the one in ``users``.
        """
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": self.mechanism,
            "sasl.username": user,
            "sasl.password": self.users[user] if password is None else password,
            "ssl.ca.location": str(self.truststore),
        }

    def server_properties(self, port: int, controller_port: int) -> dict[str, str]:
        """The ``server.properties`` entries that replace the PLAINTEXT client listener with SASL_SSL."""
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.inter_broker_user}" password="{self.users[self.inter_broker_user]}";'
        )
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
            # The controller listener stays PLAINTEXT: it is bound to loopback and only the broker itself uses it.
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": self.mechanism,
            "sasl.mechanism.inter.broker.protocol": self.mechanism,
            f"listener.name.sasl_ssl.{self.mechanism.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(Path(self.keystore).resolve()),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(Path(self.truststore).resolve()),
        }

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments that create the SCRAM users."""
        return [
            arg
            for user, password in self.users.items()
            for arg in ("--add-scram", f"{self.mechanism}=[name={user},password={password}]")
        ]


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """Whether the broker of a run directory is running, and where."""

    running: bool
    run_dir: Path
    state: BrokerState | None
    log_file: Path

    @property
    def bootstrap_servers(self) -> str | None:
        return self.state.bootstrap_servers if self.state is not None else None


class EmbeddedBroker:
    """Start, find and stop the single-node KRaft broker of a run directory.

    Args:
        run_dir: the broker's directory (config, data, logs, state).
        kafka_home: Kafka installation; None finds one (``$KAFKA_HOME``, then ``kafka install``'s cache).
        port: client port; 0 picks a free one (and keeps it across restarts while it stays free).
        heap_mb: JVM heap.
        startup_timeout_s: how long :meth:`start` waits for the broker to answer.
        properties: extra ``server.properties`` entries; they win over the generated ones.
        controller_port: controller listener port; 0 picks a free one (kept across restarts like ``port``).
        cluster_id: the cluster id to format a new data directory with; None makes one (a cluster's nodes share one).
        security: make the client listener SASL_SSL (None: PLAINTEXT on loopback).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        kafka_home: Path | None = None,
        port: int = 0,
        heap_mb: int = 512,
        startup_timeout_s: float = 60.0,
        properties: Mapping[str, str] | None = None,
        controller_port: int = 0,
        cluster_id: str | None = None,
        security: BrokerSecurity | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.kafka_home = kafka_home
        self.port = port
        self.heap_mb = heap_mb
        self.startup_timeout_s = startup_timeout_s
        self.properties = dict(properties or {})
        self.controller_port = controller_port
        self.cluster_id = cluster_id
        self.security = security
        self._process: ChildProcess | None = None

    @classmethod
    def from_config(cls, config: Config) -> EmbeddedBroker:
        """The broker of ``config.data_dir / "kafka"`` with the ``broker`` section's settings."""
        b = config.broker
        return cls(
            config.data_dir / "kafka",
            kafka_home=b.kafka_home,
            port=b.port,
            heap_mb=b.heap_mb,
            startup_timeout_s=b.startup_timeout_s,
            properties=b.properties,
        )

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.run_dir / "logs" / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        """The running broker's address.

        Raises:
            BrokerError: it is not running.
        """
        status = self.status()
        if not status.running or status.state is None:
            raise BrokerError(f"no broker running in {self.run_dir}")
        return status.state.bootstrap_servers

    def status(self) -> BrokerStatus:
        """Read the state file and check that its process is alive (this works from any process)."""
        state = self._read_state()
        running = state is not None and state.pid is not None and self._alive(state.pid)
        return BrokerStatus(running, self.run_dir, state, self.log_file)

    def start(self, *, detach: bool = False, wait: bool = True) -> str:
        """Start the broker (formatting its storage on first use) and wait until it answers; idempotent.

        Args:
            detach: keep the broker running after this process exits (``kafka start``). Otherwise, on Linux, the
                broker is terminated when this process dies, so a crashed test run leaves no JVM behind.
            wait: wait until it answers. A cluster's node cannot answer before a quorum of controllers runs, so
                :class:`EmbeddedCluster` launches every node first and then waits with :meth:`wait_until_ready`.

        Returns:
            The bootstrap address, e.g. ``127.0.0.1:41234``.

        Raises:
            BrokerError: no Java or Kafka installation, formatting failed, or the broker did not answer within
                ``startup_timeout_s`` (the message ends with the broker's log tail).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            status = self.status()
            if status.running and status.state is not None:
                return status.state.bootstrap_servers
            home = find_kafka_home(self.kafka_home)
            java = _find_java()
            previous = status.state
            attempt = 1
            while True:
                port = self.port or _reuse_or_free_port(previous.port if previous else None)
                controller_port = self.controller_port or _reuse_or_free_port(
                    previous.controller_port if previous else None, avoid={port}
                )
                cluster_id = self._format_once(java, home, port, controller_port)
                process = self._launch(java, home, detach)
                state = BrokerState(
                    pid=process.pid,
                    port=port,
                    controller_port=controller_port,
                    cluster_id=cluster_id,
                    kafka_home=str(home),
                    installation=installation_name(home),
                    started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                )
                self._write_state(state)
                if not wait:
                    return state.bootstrap_servers
                try:
                    self._wait_until_ready(state, process)
                except BrokerError as exc:
                    self._terminate(state, timeout_s=10.0)
                    port_taken = "Address already in use" in exc.log_tail
                    if not (port_taken and not self.port and attempt < _START_ATTEMPTS):
                        raise
                    log.warning("broker port was taken before the JVM bound it; retrying with new ports")
                    previous, attempt = None, attempt + 1
                    continue
                log.info("broker %s ready at %s (pid %d)", self.run_dir, state.bootstrap_servers, process.pid)
                return state.bootstrap_servers

    def wait_until_ready(self) -> None:
        """Wait until the broker this object started answers (after ``start(wait=False)``).

        Raises:
            BrokerError: it was not started by this object, it exited, or it did not answer within
                ``startup_timeout_s``.
        """
        state, process = self._read_state(), self._process
        if state is None or process is None or process.pid != state.pid:
            raise BrokerError(f"the broker in {self.run_dir} was not started by this process")
        self._wait_until_ready(state, process)

    def kill(self) -> None:
        """SIGKILL the broker this object started, as a crash would (no clean shutdown); for failure tests.

        Raises:
            BrokerError: it was not started by this object or is not running.
        """
        with self._lock():
            state, process = self._read_state(), self._process
            if state is None or process is None or process.pid != state.pid or not process.running():
                raise BrokerError(f"no broker started by this process runs in {self.run_dir}")
            signal_group(process.pid, signal.SIGKILL)
            process.stop(10.0)  # reaps it
            self._write_state(BrokerState(**{**asdict(state), "pid": None}))
            self._process = None

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker with SIGTERM (a clean shutdown), SIGKILL after ``timeout_s``; works from any process.

        Returns:
            True if a broker was running.
        """
        if not self.run_dir.is_dir():
            return False
        with self._lock():
            state = self._read_state()
            if state is None or state.pid is None or not self._alive(state.pid):
                return False
            self._terminate(state, timeout_s)
            return True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the JVM's output and of the broker log."""
        tails = ((path.name, log_tail(path, lines)) for path in (self.run_dir / "logs" / "jvm.out", self.log_file))
        return "\n".join(f"[{name}]\n{text}" for name, text in tails if text)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- internals ---

    def _format_once(self, java: str, home: Path, port: int, controller_port: int) -> str:
        """Write the configs; format the storage unless it already is. Returns the cluster id."""
        (self.run_dir / "logs").mkdir(exist_ok=True)
        server = self.run_dir / "server.properties"
        secured = self.security.server_properties(port, controller_port) if self.security else {}
        server.write_text(_server_properties(port, controller_port, self.data_dir, {**secured, **self.properties}))
        server.chmod(0o600)  # holds the inter-broker password when secured
        (self.run_dir / "log4j2.properties").write_text(_LOG4J2.format(logs=self.run_dir / "logs"))
        meta = self.data_dir / "meta.properties"
        if meta.is_file():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.partition("=")[2].strip()
            raise BrokerError(f"{meta} has no cluster.id: the data directory is damaged")
        cluster_id = self.cluster_id or _new_cluster_id()
        cmd = [
            java,
            *self._jvm_flags(home, heap_mb=256),
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",  # '=' form: a base64 id may begin with '-'
            "-c",
            str(server),
            "--ignore-formatted",
            *(self.security.format_arguments() if self.security else []),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise BrokerError(
                f"formatting {self.data_dir} failed (exit {result.returncode})",
                (result.stdout + result.stderr)[-4000:],
            )
        return cluster_id

    def _jvm_flags(self, home: Path, heap_mb: int) -> list[str]:
        return [
            f"-Xms{heap_mb}m",
            f"-Xmx{heap_mb}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.run_dir / 'log4j2.properties'}",
            "-cp",
            f"{home / 'libs'}/*",
        ]

    def _launch(self, java: str, home: Path, detach: bool) -> ChildProcess:
        cmd = [java, *self._jvm_flags(home, self.heap_mb), "kafka.Kafka", str(self.run_dir / "server.properties")]
        jvm_out = self.run_dir / "logs" / "jvm.out"
        self._process = ChildProcess("broker", cmd, None, jvm_out, cwd=self.run_dir, detach=detach)
        self._process.start()
        return self._process

    def _wait_until_ready(self, state: BrokerState, process: ChildProcess) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        # Not the user's kafka.client settings: the broker's own (plaintext on loopback, or its inter-broker user).
        client = self.security.client_properties(self.security.inter_broker_user) if self.security else {}
        admin = Admin(
            KafkaConfig(bootstrap_servers=state.bootstrap_servers, client=client),
            overrides={"reconnect.backoff.max.ms": 200, "log_level": 0},  # silent while the JVM boots
        )
        while True:
            code = process.returncode
            if code is not None:
                raise BrokerError(f"the broker exited with code {code} while starting", self.log_tail())
            try:
                if admin.client.list_topics(timeout=0.5).brokers:
                    return
            except KafkaException:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the broker did not answer at {state.bootstrap_servers} within {self.startup_timeout_s:.0f} s",
                    self.log_tail(),
                )

    def _terminate(self, state: BrokerState, timeout_s: float) -> None:
        assert state.pid is not None
        if self._process is not None and self._process.pid == state.pid:
            self._process.stop(timeout_s)
        else:
            # Another process's broker (`kafka start` detached it): all there is to go on is its pid.
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pid, signal.SIGTERM)
            if not self._wait_gone(state.pid, timeout_s):
                log.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", state.pid, timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.pid, signal.SIGKILL)
                self._wait_gone(state.pid, 10.0)
        self._write_state(BrokerState(**{**asdict(state), "pid": None}))
        self._process = None

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._alive(pid):
                return True
            time.sleep(0.1)  # not our child: nothing to wait on but its /proc entry
        return not self._alive(pid)

    def _alive(self, pid: int) -> bool:
        """Whether ``pid`` is this run directory's broker (not a dead one's recycled pid, not a zombie)."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        proc = Path(f"/proc/{pid}")
        if not proc.is_dir():
            return True  # no procfs (macOS): trust the signal check
        try:
            if (proc / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
                return False
            return str(self.run_dir / "server.properties").encode() in (proc / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return False

    def _read_state(self) -> BrokerState | None:
        path = self.run_dir / STATE_FILE
        if not path.is_file():
            return None
        try:
            return BrokerState(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError) as exc:
            raise BrokerError(f"{path} is unreadable ({exc}); delete it if no broker runs there") from None

    def _write_state(self, state: BrokerState) -> None:
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp.replace(path)  # atomic: a concurrent `kafka status` never reads half a file

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # Two `kafka start` at once on one run directory would format or launch twice.
        with (self.run_dir / ".lock").open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class EmbeddedCluster:
    """Start and stop ``nodes`` embedded brokers as one KRaft cluster on this machine (each node is broker and
    controller), replicated like a production cluster: internal topics and new topics get ``min(nodes, 3)`` replicas
    and ``min.insync.replicas=2``, so an ``acks=all`` write survives the loss of any one node.

    Layout: ``run_dir/cluster.json`` (cluster id and every node's ports, picked free on the first start and reused
    after), and ``run_dir/node-<i>/`` the run directory of node ``i`` (see :class:`EmbeddedBroker`).

    Args:
        run_dir: the cluster's directory.
        nodes: how many nodes (3 tolerates one lost node; 1 is a single broker with a cluster's layout).
        kafka_home: Kafka installation; None finds one.
        heap_mb: JVM heap of each node.
        startup_timeout_s: how long :meth:`start` waits for every node to answer.
        properties: extra ``server.properties`` entries for every node; they win over the generated ones.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        nodes: int = 3,
        kafka_home: Path | None = None,
        heap_mb: int = 384,
        startup_timeout_s: float = 90.0,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        if nodes < 1:
            raise BrokerError(f"nodes must be at least 1, got {nodes}")
        self.run_dir = Path(run_dir).resolve()
        self.size = nodes
        self.kafka_home = kafka_home
        self.heap_mb = heap_mb
        self.startup_timeout_s = startup_timeout_s
        self.properties = dict(properties or {})
        self._nodes: list[EmbeddedBroker] | None = None

    @property
    def nodes(self) -> list[EmbeddedBroker]:
        """The nodes, node id ``i + 1`` at index ``i`` (ports are picked, or read back, on first access)."""
        if self._nodes is None:
            self._nodes = self._build_nodes()
        return self._nodes

    def node(self, node_id: int) -> EmbeddedBroker:
        """The node with this ``node.id`` (1-based)."""
        return self.nodes[node_id - 1]

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, comma-separated (clients reach the cluster while any one of them is up)."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self, *, detach: bool = False) -> str:
        """Start every node that is not running and wait until all answer; idempotent.

        Returns:
            The bootstrap address list.

        Raises:
            BrokerError: a node could not be formatted or started, or did not answer in time (with its log tail).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started = [node for node in self.nodes if not node.status().running]
        try:
            # All first, then wait: no node answers before a majority of the controllers runs.
            for node in started:
                node.start(detach=detach, wait=False)
            for node in started:
                node.wait_until_ready()
        except BrokerError:
            for node in started:
                node.stop(timeout_s=10.0)
            raise
        log.info("cluster %s ready at %s", self.run_dir, self.bootstrap_servers)
        return self.bootstrap_servers

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop every node (SIGTERM, SIGKILL after ``timeout_s``); True if any was running."""
        if not (self.run_dir / CLUSTER_FILE).is_file():
            return False
        # All at once: one by one, the last nodes wait out their controlled shutdown with no quorum left.
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            return any(list(pool.map(lambda node: node.stop(timeout_s), self.nodes)))

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _build_nodes(self) -> list[EmbeddedBroker]:
        layout = self._layout()
        voters = ",".join(f"{n['node_id']}@127.0.0.1:{n['controller_port']}" for n in layout["nodes"])
        replicas = min(self.size, 3)
        isr = min(replicas, 2)
        shared = {
            "controller.quorum.voters": voters,
            "offsets.topic.replication.factor": str(replicas),
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(isr),
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(isr),
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(isr),
            # Kafka's default (9 s), not the single node's patient 60 s: a dead node must be fenced, and its
            # partitions led by another replica, within seconds; that is what the replicas are for.
            "broker.session.timeout.ms": "9000",
        }
        return [
            EmbeddedBroker(
                self.run_dir / f"node-{n['node_id']}",
                kafka_home=self.kafka_home,
                port=n["port"],
                controller_port=n["controller_port"],
                cluster_id=layout["cluster_id"],
                heap_mb=self.heap_mb,
                startup_timeout_s=self.startup_timeout_s,
                properties={**shared, "node.id": str(n["node_id"]), **self.properties},
            )
            for n in layout["nodes"]
        ]

    def _layout(self) -> dict[str, Any]:
        path = self.run_dir / CLUSTER_FILE
        if path.is_file():
            layout: dict[str, Any] = json.loads(path.read_text())
            if len(layout["nodes"]) != self.size:
                raise BrokerError(f"{path} describes {len(layout['nodes'])} nodes, not {self.size}")
            return layout
        taken: set[int] = set()
        nodes = []
        for node_id in range(1, self.size + 1):
            port = _reuse_or_free_port(None, avoid=taken)
            controller_port = _reuse_or_free_port(None, avoid=taken | {port})
            taken |= {port, controller_port}
            nodes.append({"node_id": node_id, "port": port, "controller_port": controller_port})
        layout = {"cluster_id": _new_cluster_id(), "nodes": nodes}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(layout, indent=2) + "\n")
        return layout


def _server_properties(port: int, controller_port: int, data_dir: Path, extra: Mapping[str, str]) -> str:
    props: dict[str, Any] = {
        "process.roles": "broker,controller",
        "node.id": 1,
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": data_dir,
        # One node: internal topics with more replicas (the defaults are 3) would never become available.
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        # No 3 s wait for more members before a group's first assignment.
        "group.initial.rebalance.delay.ms": 0,
        # The controller fences a broker whose heartbeats stop for this long; fencing the only broker (a GC pause, a
        # laptop's sleep, a starved CPU) just makes every client fail, so be patient (default 9 s).
        "broker.session.timeout.ms": 60_000,
        # The cleaner's default 128 MB buffer is most of a small heap.
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        # Topics are created with their configs (ensure_run_topics); an auto-created weights topic would not be
        # compacted, and a typo in a topic name would silently create a new one.
        "auto.create.topics.enable": "false",
    }
    props.update(extra)
    return "".join(f"{k}={v}\n" for k, v in props.items())


_LOG4J2 = """\
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=FILE
appender.file.type=RollingFile
appender.file.name=FILE
appender.file.fileName={logs}/broker.log
appender.file.filePattern={logs}/broker.log.%i
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
appender.file.policies.type=Policies
appender.file.policies.size.type=SizeBasedTriggeringPolicy
appender.file.policies.size.size=10MB
appender.file.strategy.type=DefaultRolloverStrategy
appender.file.strategy.max=3
"""


def _new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in unpadded URL-safe base64, as ``StorageTool random-uuid`` prints."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # some tools parse a leading '-' as an option
            return cluster_id


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError(
            "java not found: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return java


def _reuse_or_free_port(preferred: int | None, avoid: set[int] | None = None) -> int:
    if preferred and preferred not in (avoid or set()) and port_free(preferred):
        return preferred
    while True:
        port = free_port()
        if port not in (avoid or set()):
            return port
