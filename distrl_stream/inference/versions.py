"""The weight-version watcher: hot-loads each published policy version into the vLLM server.

It reads the compacted ``{run}.weights`` topic from the start (so a server that starts late catches up on the
latest versions), and for every :class:`~distrl_stream.events.WeightVersionEvent` of its policy that is newer than
what it serves:

1. copies the adapter folder into a staging folder the server owns, and checks the copy's sha256 (and size)
   against the event: a mismatch or a missing folder is refused and reported, never served. Checking a private
   copy (not the original) means nobody can change the files between the check and the load;
2. loads it with ``POST /v1/load_lora_adapter`` under the name ``<policy_id>-v<version>``, so clients see it in
   ``/v1/models`` and switch to it;
3. unloads (and deletes the staged copy of) versions beyond the newest ``keep_versions``;
4. publishes a :class:`~distrl_stream.events.MetricEvent` on ``{run}.metrics`` (``labels.event`` = ``loaded`` or
   ``refused``), so the monitor sees what is served.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import SecretStr

from distrl_stream.artifacts import dir_size, local_path, sha256_dir
from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config
from distrl_stream.errors import AdapterVerificationError, ArtifactError, InferenceError
from distrl_stream.events import MetricEvent, WeightVersionEvent, utc_now
from distrl_stream.inference.client import auth_headers, served_name
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """A version the server now serves.

    Attributes:
        version: the policy version.
        name: its served name (``<policy_id>-v<version>``).
        path: the verified staged copy the server loaded.
        load_s: copy + verify + load time.
        retired: versions unloaded to keep at most ``keep_versions``.
    """

    version: int
    name: str
    path: Path
    load_s: float
    retired: tuple[int, ...] = ()


@dataclass
class AdapterLoader:
    """Verify-then-load of LoRA versions into one vLLM server, keeping the newest ``keep_versions``.

    Args:
        server_url: the vLLM server (``http://host:port``).
        policy_id: versions of other policies are ignored.
        keep_versions: how many adapter versions stay loaded.
        staging_dir: where verified copies of the adapters live while they are served.
        timeout_s: bound on each load/unload request (a load reads the adapter from disk).
        api_key: the server's key (``inference.api_key``), if it has one.
    """

    server_url: str
    policy_id: str
    keep_versions: int
    staging_dir: Path
    timeout_s: float = 120.0
    api_key: SecretStr | None = None
    loaded: list[int] = field(default_factory=list)

    @property
    def newest(self) -> int:
        """The newest version served (0 = only the base model)."""
        return self.loaded[-1] if self.loaded else 0

    def load(self, event: WeightVersionEvent) -> LoadReport | None:
        """Serve ``event``'s adapter if it is a newer version of this policy.

        Returns:
            What was loaded, or None when the event is for another policy or not newer than the newest served.

        Raises:
            AdapterVerificationError: the adapter is missing or its bytes do not match the event (not served).
            InferenceError: the server refused or failed the load (e.g. a LoRA rank above --max-lora-rank).
        """
        if event.policy_id != self.policy_id or event.version <= self.newest:
            return None
        started = time.monotonic()
        name = served_name(self.policy_id, event.version)
        staged = self._stage_verified(event, name)
        try:
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(staged)})
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        self.loaded.append(event.version)
        retired: list[int] = []
        while len(self.loaded) > self.keep_versions:
            old = self.loaded.pop(0)
            self._post("/v1/unload_lora_adapter", {"lora_name": served_name(self.policy_id, old)})
            shutil.rmtree(self.staging_dir / served_name(self.policy_id, old), ignore_errors=True)
            retired.append(old)
        report = LoadReport(event.version, name, staged, time.monotonic() - started, tuple(retired))
        log.info("serving %s (%.2fs); retired %s", name, report.load_s, retired or "none")
        return report

    def _stage_verified(self, event: WeightVersionEvent, name: str) -> Path:
        try:
            source = local_path(event.adapter_uri)
        except ArtifactError as exc:
            raise AdapterVerificationError(f"{name}: {exc}") from None
        if not source.is_dir():
            raise AdapterVerificationError(f"{name}: adapter folder {source} does not exist")
        staged = self.staging_dir / name
        shutil.rmtree(staged, ignore_errors=True)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, staged, symlinks=True)
        try:
            digest, size = sha256_dir(staged), dir_size(staged)
        except ArtifactError as exc:
            shutil.rmtree(staged, ignore_errors=True)
            raise AdapterVerificationError(f"{name}: {exc}") from None
        if digest != event.sha256 or size != event.size_bytes:
            shutil.rmtree(staged, ignore_errors=True)
            raise AdapterVerificationError(
                f"{name}: adapter {event.adapter_uri} does not match its weight-version event "
                f"(sha256 {digest[:16]}…, {size} bytes; published {event.sha256[:16]}…, {event.size_bytes} bytes)"
            )
        return staged

    def _post(self, path: str, payload: dict[str, str]) -> None:
        try:
            response = httpx.post(
                f"{self.server_url}{path}", json=payload, timeout=self.timeout_s, headers=auth_headers(self.api_key)
            )
        except httpx.HTTPError as exc:
            raise InferenceError(f"{path} on {self.server_url} failed: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise InferenceError(f"{path} {payload} on {self.server_url}: HTTP {response.status_code}: {response.text}")


class WeightWatcher(BackgroundFollower):
    """Follows ``{run}.weights`` in a background thread and hot-loads new versions (see the module docstring).

    Args:
        cfg: run, Kafka, model (policy id) and inference (keep_versions) settings.
        server_url: the vLLM server to load into.
        source_id: names this server in metric events; default ``<hostname>:<port>``.
        staging_dir: verified adapter copies; default ``<run_dir>/serving/<source_id>``.
        catch_up_timeout_s: bound on reading the topic's backlog before going live.
    """

    thread_name = "weight-watcher"

    def __init__(
        self,
        cfg: Config,
        server_url: str,
        *,
        source_id: str | None = None,
        staging_dir: Path | None = None,
        catch_up_timeout_s: float = 60.0,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.topics = TopicNames(cfg.run)
        self.source_id = source_id or f"{socket.gethostname()}:{server_url.rsplit(':', 1)[-1]}"
        self.loader = AdapterLoader(
            server_url,
            cfg.model.policy_id,
            cfg.inference.keep_versions,
            staging_dir or cfg.run_dir / "serving" / self.source_id.replace(":", "_"),
            api_key=cfg.inference.api_key,
        )
        self.catch_up_timeout_s = catch_up_timeout_s
        self.refused: list[tuple[int, str]] = []
        self.caught_up = threading.Event()

    @property
    def newest_version(self) -> int:
        """The newest version this watcher has loaded (0 = the base model only)."""
        return self.loader.newest

    def _follow(self) -> None:
        ensure_run_topics(self.cfg)
        producer = Producer(self.cfg.kafka, client_id=f"inference-{self.source_id}")
        # No group: every server must see every version, so each one reads all partitions itself.
        follower = TopicFollower(
            self.cfg.kafka,
            self.topics.weights,
            WeightVersionEvent,
            client_id=f"inference-watcher-{self.source_id}",
            dead_letters=DeadLetterQueue(producer, self.topics.dlq, f"inference-watcher-{self.source_id}"),
        )
        try:
            follower.start()
            self._catch_up(follower, producer)
            self.caught_up.set()
            while not self._stop.is_set():
                event = follower.poll(0.5)
                if event is not None:
                    self._handle(event, producer)
                producer.poll(0)
        finally:
            follower.close()
            producer.close()

    def _catch_up(self, follower: TopicFollower[WeightVersionEvent], producer: Producer) -> None:
        """Read the backlog, then load only the newest ``keep_versions`` of it (not every version ever published)."""
        backlog: dict[int, WeightVersionEvent] = {}
        deadline = time.monotonic() + self.catch_up_timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline and not follower.caught_up():
            event = follower.poll(0.5)
            if event is not None and event.policy_id == self.loader.policy_id:
                backlog[event.version] = event
        newest = sorted(backlog)[-self.loader.keep_versions :]
        log.info("weights backlog: %d versions of %s; loading %s", len(backlog), self.loader.policy_id, newest)
        for version in newest:
            self._handle(backlog[version], producer)

    def _handle(self, event: WeightVersionEvent, producer: Producer) -> None:
        labels = {"policy_id": event.policy_id, "adapter": served_name(event.policy_id, event.version)}
        try:
            report = self.loader.load(event)
        except (AdapterVerificationError, InferenceError) as exc:
            # A bad version is refused and reported; the server goes on serving what it has.
            log.error("refused %s v%d: %s", event.policy_id, event.version, exc)
            self.refused.append((event.version, str(exc)))
            self._publish(
                producer,
                {"refused_version": float(event.version)},
                {**labels, "event": "refused", "reason": str(exc)[:500]},
            )
            return
        if report is not None:
            values = {
                "policy_version": float(report.version),
                "adapter_load_s": report.load_s,
                "loaded_versions": float(len(self.loader.loaded)),
            }
            self._publish(producer, values, {**labels, "event": "loaded"})

    def _publish(self, producer: Producer, values: dict[str, float], labels: dict[str, str]) -> None:
        event = MetricEvent(
            run=self.cfg.run,
            role="inference",
            source_id=self.source_id,
            timestamp=utc_now(),
            values=values,
            labels=labels,
        )
        producer.produce_event(self.topics.metrics, event)
