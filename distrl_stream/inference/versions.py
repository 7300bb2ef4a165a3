"""The weight-version watcher: hot-loads each published policy version into the vLLM server.

It reads the compacted ``{run}.weights`` topic from the start (so a server that starts late catches up on the
latest versions), and for every :class:`~distrl_stream.events.WeightVersionEvent` of its policy that is newer than
what it serves:

1. checks the event's base-model fingerprint against the server's own base model (``base_model`` refusal);
2. fetches the adapter through :func:`distrl_stream.artifacts.fetch` (``kafka://`` chunks, a ``file://`` folder or
   an fsspec URL) into ``staging_dir/<policy_id>-v<version>-<sha256>``, a folder the server owns, checking every
   chunk's sha256 (``chunk``), then the whole folder's sha256 and size against the event (``hash``); what cannot be
   found is ``missing``. Checking a private copy (not the original) means nobody can change the files between the
   check and the load. The staged folder's name ends with the adapter's full sha256: vLLM reports it as the
   adapter's ``root`` in ``/v1/models``, which is how a client learns which bytes a served name stands for;
3. loads it with ``POST /v1/load_lora_adapter`` under the name ``<policy_id>-v<version>``, so clients see it in
   ``/v1/models`` and switch to it;
4. unloads versions beyond the newest ``keep_versions``, and deletes a retired version's staged copy only
   ``retired_grace_s`` later: vLLM reloads an adapter from that folder for a request accepted before the unload
   (once the adapter left its LoRA cache), and a missing folder kills the whole engine (docs/inference.md);
5. publishes a :class:`~distrl_stream.events.MetricEvent` on ``{run}.metrics`` (``labels.event`` = ``loaded`` or
   ``refused``, a refusal with ``labels.category`` = ``chunk``, ``hash``, ``missing``, ``base_model`` or ``server``),
   so the monitor sees what is served. A refused version is never served; the server goes on serving what it had.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import SecretStr

from distrl_stream.artifacts import base_fingerprint, fetch
from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config, KafkaConfig
from distrl_stream.errors import AdapterVerificationError, ArtifactError, ArtifactIntegrityError, InferenceError
from distrl_stream.events import MetricEvent, WeightVersionEvent, utc_now
from distrl_stream.inference.client import auth_headers, served_name
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.monitor.prometheus import WatcherMetrics
from distrl_stream.policy.model_dir import resolve_model_dir

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def staged_name(policy_id: str, version: int, sha256: str) -> str:
    """The staged folder of a version: ``<policy_id>-v<version>-<sha256>`` (the full 64-hex sha256 last)."""
    return f"{served_name(policy_id, version)}-{sha256}"


@dataclass(frozen=True)
class LoadReport:
    """A version the server now serves.

    Attributes:
        version: the policy version.
        name: its served name (``<policy_id>-v<version>``).
        path: the verified staged copy the server loaded (``staging_dir/<name>-<sha256>``).
        load_s: fetch + verify + load time.
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
        kafka: the cluster ``kafka://`` adapters are fetched from (None: such a version is refused as ``missing``).
        fetch_timeout_s: bound on fetching one adapter (``artifacts.fetch_timeout_s``).
        base_model: the server's base model id (named in a ``base_model`` refusal).
        base_fingerprint: the server's :func:`~distrl_stream.artifacts.model_fingerprint`; "" skips the check, as
            does an event without one (written before events carried it).
        retired_grace_s: how long a retired version's staged copy stays on disk
            (``inference.retired_adapter_grace_s``).
    """

    server_url: str
    policy_id: str
    keep_versions: int
    staging_dir: Path
    timeout_s: float = 120.0
    api_key: SecretStr | None = None
    kafka: KafkaConfig | None = None
    fetch_timeout_s: float = 120.0
    base_model: str = ""
    base_fingerprint: str = ""
    retired_grace_s: float = 120.0
    loaded: list[int] = field(default_factory=list)
    staged: dict[int, Path] = field(default_factory=dict)
    retiring: list[tuple[float, Path]] = field(default_factory=list)  # (monotonic time retired, staged copy)

    @property
    def newest(self) -> int:
        """The newest version served (0 = only the base model)."""
        return self.loaded[-1] if self.loaded else 0

    def load(self, event: WeightVersionEvent) -> LoadReport | None:
        """Serve ``event``'s adapter if it is a newer version of this policy.

        Returns:
            What was loaded, or None when the event is for another policy or not newer than the newest served.

        Raises:
            AdapterVerificationError: the adapter is for another base model, missing, or its bytes do not match
                the event (not served); ``reason`` says which.
            InferenceError: the server refused or failed the load (e.g. a LoRA rank above --max-lora-rank).
        """
        if event.policy_id != self.policy_id or event.version <= self.newest:
            return None
        started = time.monotonic()
        name = served_name(self.policy_id, event.version)
        self._check_base(event, name)
        staged = self._stage_verified(event, name)
        try:
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(staged)})
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        self.loaded.append(event.version)
        self.staged[event.version] = staged
        retired: list[int] = []
        while len(self.loaded) > self.keep_versions:
            old = self.loaded.pop(0)
            self._post("/v1/unload_lora_adapter", {"lora_name": served_name(self.policy_id, old)})
            self.retiring.append((time.monotonic(), self.staged.pop(old)))
            retired.append(old)
        self.remove_retired()
        report = LoadReport(event.version, name, staged, time.monotonic() - started, tuple(retired))
        log.info("serving %s (%.2fs); retired %s", name, report.load_s, retired or "none")
        return report

    def remove_retired(self) -> None:
        """Delete the staged copies of versions retired more than ``retired_grace_s`` ago."""
        now = time.monotonic()
        while self.retiring and now - self.retiring[0][0] >= self.retired_grace_s:
            shutil.rmtree(self.retiring.pop(0)[1], ignore_errors=True)

    def clear_staging(self) -> None:
        """Delete every staged copy. Only while no vLLM process can still load from them: before this server's vLLM
        loaded anything (leftovers of a killed predecessor) or after it stopped."""
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        self.loaded.clear()
        self.staged.clear()
        self.retiring.clear()

    def _check_base(self, event: WeightVersionEvent, name: str) -> None:
        if self.base_fingerprint and event.base_fingerprint and event.base_fingerprint != self.base_fingerprint:
            raise AdapterVerificationError(
                f"{name}: adapter for base model {event.base_model!r} (fingerprint {event.base_fingerprint[:16]}…) "
                f"but this server serves {self.base_model!r} (fingerprint {self.base_fingerprint[:16]}…)",
                "base_model",
            )

    def _stage_verified(self, event: WeightVersionEvent, name: str) -> Path:
        if not _SHA256.match(event.sha256):
            raise AdapterVerificationError(f"{name}: published sha256 {event.sha256!r} is not 64 hex digits", "hash")
        staged = self.staging_dir / staged_name(self.policy_id, event.version, event.sha256)
        shutil.rmtree(staged, ignore_errors=True)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        try:
            fetch(
                event.adapter_uri,
                staged,
                sha256=event.sha256,
                size_bytes=event.size_bytes,
                kafka=self.kafka,
                timeout_s=self.fetch_timeout_s,
            )
        except ArtifactIntegrityError as exc:
            raise AdapterVerificationError(f"{name}: {exc}", exc.reason) from None
        except ArtifactError as exc:
            raise AdapterVerificationError(f"{name}: {exc}", "missing") from None
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
        model_dir: the base model the server serves, fingerprinted to refuse adapters of another base; default
            ``model.base`` or the local model (built if missing).
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
        model_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.model_dir = model_dir
        self.topics = TopicNames(cfg.run)
        self.source_id = source_id or f"{socket.gethostname()}:{server_url.rsplit(':', 1)[-1]}"
        self.loader = AdapterLoader(
            server_url,
            cfg.model.policy_id,
            cfg.inference.keep_versions,
            staging_dir or cfg.run_dir / "serving" / self.source_id.replace(":", "_"),
            api_key=cfg.inference.api_key,
            kafka=cfg.kafka,
            fetch_timeout_s=cfg.artifacts.fetch_timeout_s,
            base_model=cfg.model.base_model_id,
            retired_grace_s=cfg.inference.retired_adapter_grace_s,
        )
        self.catch_up_timeout_s = catch_up_timeout_s
        self.refused: list[tuple[int, str]] = []
        self.refused_by_reason: dict[str, int] = {}
        self.caught_up = threading.Event()
        self.published_version = 0  # the newest version of our policy seen on the topic
        self.prometheus = WatcherMetrics(
            cfg.run,
            self.source_id,
            served_version=lambda: self.loader.newest,
            published_version=lambda: self.published_version,
            loaded_versions=lambda: len(self.loader.loaded),
            refused=lambda: len(self.refused),
        )
        self.prometheus.counter(
            "distrl_inference_versions_refused_by_reason",
            "Versions refused, by reason: chunk, hash, missing, base_model, server.",
            lambda: dict(self.refused_by_reason),
            label="reason",
        )

    def start(self) -> None:
        """Serve the metrics (``inference.metrics_port``), then follow the topic in the background."""
        self.prometheus.serve(self.cfg.inference.metrics_port, "inference.metrics_port")
        super().start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop following and serving the metrics."""
        super().stop(timeout_s)
        self.prometheus.close()

    @property
    def newest_version(self) -> int:
        """The newest version this watcher has loaded (0 = the base model only)."""
        return self.loader.newest

    def _follow(self) -> None:
        # Here, not in __init__: hashing a large base model (first time only; then cached) must not block start().
        self.loader.base_fingerprint = base_fingerprint(self.cfg, self.model_dir or resolve_model_dir(self.cfg))
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
                self.loader.remove_retired()
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
        if event.policy_id == self.loader.policy_id:
            self.published_version = max(self.published_version, event.version)
        try:
            report = self.loader.load(event)
        except (AdapterVerificationError, InferenceError) as exc:
            # A bad version is refused and reported; the server goes on serving what it has.
            category = exc.reason if isinstance(exc, AdapterVerificationError) else "server"
            log.error("refused %s v%d (%s): %s", event.policy_id, event.version, category, exc)
            self.refused.append((event.version, str(exc)))
            self.refused_by_reason[category] = self.refused_by_reason.get(category, 0) + 1
            self._publish(
                producer,
                {"refused_version": float(event.version)},
                {**labels, "event": "refused", "category": category, "reason": str(exc)[:500]},
            )
            return
        if report is not None:
            self.prometheus.loaded(report.load_s)
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
