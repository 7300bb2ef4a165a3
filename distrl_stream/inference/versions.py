"""The weight-version watcher: hot-loads each published policy version into the vLLM server.

It reads the compacted ``{run}.weights`` topic from the start (so a server that starts late catches up on the
latest versions), and for every :class:`~distrl_stream.events.WeightVersionEvent` of its policy that is newer than
what it serves:

1. checks the event's base-model fingerprint against the server's own base model (``base_model`` refusal);
2. fetches the adapter through :func:`distrl_stream.artifacts.fetch` (``kafka://`` chunks, a ``file://`` folder or
   an fsspec URL) into ``staging_dir/<policy_id>-v<version>-<sha256>``, a folder the server owns, checking every
   chunk's sha256 (``chunk``), then the whole folder's sha256 and size against the event (``hash``); what cannot be
   found or read is ``missing``, a URI that cannot be used is ``malformed``. Checking a private copy (not the
   original) means nobody can change the files between the check and the load. The staged folder's name ends with
   the adapter's full sha256: vLLM reports it as the adapter's ``root`` in ``/v1/models``, which is how a client
   learns which bytes a served name stands for;
3. loads it with ``POST /v1/load_lora_adapter`` under the name ``<policy_id>-v<version>``, so clients see it in
   ``/v1/models`` and switch to it;
4. unloads versions beyond the newest ``keep_versions``, and deletes a retired version's staged copy only
   ``retired_grace_s`` later: vLLM reloads an adapter from that folder for a request accepted before the unload
   (once the adapter left its LoRA cache), and a missing folder kills the whole engine (docs/inference.md);
5. publishes a :class:`~distrl_stream.events.MetricEvent` on ``{run}.metrics`` (``labels.event`` = ``loaded`` or
   ``refused``, a refusal with ``labels.category`` = ``chunk``, ``hash``, ``missing``, ``malformed``, ``base_model``
   or ``server``), so the monitor sees what is served. A refused version is never served; the server goes on
   serving what it had.

A failure that can pass (:func:`classify`: the adapter not readable yet, the broker unreachable, vLLM not answering
or answering 5xx, 408 or 429) is retried with exponential backoff (:class:`PendingVersion`) and refused only once
its tries run out; any other failure refuses the version at once. Only the newest published version is pending: a
newer one supersedes it (counted as skipped), so a server that fell behind loads the newest version, not every one
in between.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from distrl_stream.artifacts import base_fingerprint, fetch
from distrl_stream.artifacts.transport import AdapterSource
from distrl_stream.artifacts.weights import base_mismatch, check_version_event
from distrl_stream.background import BackgroundFollower
from distrl_stream.config import Config, KafkaConfig
from distrl_stream.errors import (
    AdapterVerificationError,
    ArtifactError,
    ArtifactIntegrityError,
    InferenceError,
    InferenceRequestError,
    InferenceUnavailableError,
    KafkaClientError,
    WeightEventError,
)
from distrl_stream.events import MetricEvent, WeightVersionEvent, utc_now
from distrl_stream.inference.client import auth_headers, served_name
from distrl_stream.inference.metrics import WatcherMetrics
from distrl_stream.kafka.dlq import DeadLetterQueue
from distrl_stream.kafka.follower import TopicFollower
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.model_dir import resolve_model_dir

log = logging.getLogger(__name__)

# Retrying a version that failed for a reason that can pass: 2 s, 4 s, … doubling up to 60 s between tries, 20 tries
# in all (about 15 minutes of waiting). That outlasts a broker restart or leader election, a learner whose file://
# folder shows up late and a busy vLLM; a version still failing then is refused, and a restarted `serve` reads the
# compacted {run}.weights again and tries its newest version afresh.
RETRY_BACKOFF_S = 2.0
RETRY_BACKOFF_MAX_S = 60.0
RETRY_ATTEMPTS = 20
# HTTP statuses of a load that may succeed later: the server timed out or is overloaded. Every 5xx is too.
_TRANSIENT_STATUS = frozenset({408, 429})


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


@dataclass(frozen=True)
class Failure:
    """Why a version was not loaded: ``category`` (a refusal's ``labels.category``) and whether a later try may
    succeed."""

    category: str
    transient: bool


def classify(exc: InferenceError) -> Failure:
    """Sort a failed load (what :meth:`AdapterLoader.load` raised) into one that may pass and one that cannot.

    Transient: ``missing`` (the adapter not there or not readable yet: a late ``file://`` folder, chunks not yet
    readable, a fetch timeout, an unreachable broker) and a server that did not answer, timed out or failed
    (:class:`~distrl_stream.errors.InferenceUnavailableError`: connection errors, 5xx, 408, 429). Permanent: bytes
    that are not what was published (``chunk``, ``hash``), an adapter of another base model (``base_model``), an
    unusable URI (``malformed``) and a server that rejected the load (4xx).
    """
    if isinstance(exc, AdapterVerificationError):
        return Failure(exc.reason, exc.reason == "missing")
    return Failure("server", isinstance(exc, InferenceUnavailableError))


def retry_delay(failures: int, backoff_s: float = RETRY_BACKOFF_S, backoff_max_s: float = RETRY_BACKOFF_MAX_S) -> float:
    """Seconds to wait after a version's ``failures``-th transient failure: ``backoff_s`` doubled per failure after
    the first, at most ``backoff_max_s``."""
    return min(backoff_s * 2.0 ** (failures - 1), backoff_max_s)


@dataclass
class PendingVersion:
    """The one version the watcher still means to load, and when to try it (time is the caller's monotonic clock).

    Only the newest published version matters: a newer one supersedes the pending one, whether it was not tried yet
    or is waiting for a retry. A transient failure is retried after :func:`retry_delay`; after ``max_attempts``
    tries in all the version is given up.
    """

    backoff_s: float = RETRY_BACKOFF_S
    backoff_max_s: float = RETRY_BACKOFF_MAX_S
    max_attempts: int = RETRY_ATTEMPTS
    event: WeightVersionEvent | None = None
    failures: int = 0
    due: float = 0.0

    def offer(self, event: WeightVersionEvent, now: float) -> WeightVersionEvent | None:
        """Make ``event`` the pending version, due at once, if it is newer than the pending one.

        Returns:
            The version this drops (the pending one it supersedes, or ``event`` itself if it is older), or None
            (nothing was pending, or ``event`` repeats the pending version).
        """
        if self.event is not None and event.version <= self.event.version:
            return event if event.version < self.event.version else None
        superseded, self.event, self.failures, self.due = self.event, event, 0, now
        return superseded

    def due_event(self, now: float) -> WeightVersionEvent | None:
        """The pending version if it is time to try it."""
        return self.event if self.event is not None and now >= self.due else None

    def wait_s(self, now: float, poll_s: float) -> float:
        """How long to wait for new records before the pending version is due (``poll_s`` at most)."""
        return poll_s if self.event is None else min(poll_s, max(self.due - now, 0.0))

    def failed(self, now: float) -> float | None:
        """Note a transient failure of the pending version.

        Returns:
            The delay before its retry, or None when it had all its tries (it is no longer pending).
        """
        self.failures += 1
        if self.failures >= self.max_attempts:
            self.done()
            return None
        delay = retry_delay(self.failures, self.backoff_s, self.backoff_max_s)
        self.due = now + delay
        return delay

    def done(self) -> None:
        """The pending version was loaded or refused: nothing is pending."""
        self.event, self.failures = None, 0


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
        kafka: the cluster ``kafka://`` adapters are fetched from (None: such a version is refused as
            ``malformed``).
        fetch_timeout_s: bound on fetching one adapter (``artifacts.fetch_timeout_s``).
        source: where adapters may be fetched from (the server's ``artifacts.store``); a URI outside it is refused
            as ``malformed`` before anything is read. None allows every scheme.
        storage_options: the fsspec filesystem's arguments for an fsspec URI, secrets revealed
            (``artifacts.storage_options_values()``).
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
    source: AdapterSource | None = None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    base_model: str = ""
    base_fingerprint: str = ""
    retired_grace_s: float = 120.0
    loaded: list[int] = field(default_factory=list)
    staged: dict[int, Path] = field(default_factory=dict)
    retiring: list[tuple[float, Path]] = field(default_factory=list)  # (monotonic time retired, staged copy)
    # Verified copies whose load failed in a way that may pass; a timed-out load may still have reached vLLM, so the
    # copy is kept (and reused by the retry) rather than deleted under it.
    held: set[Path] = field(default_factory=set)
    # Set by close(): a watcher thread still in a fetch when its server was restarted must load nothing into the
    # new vLLM, which `serve` starts at the same URL with a watcher of its own.
    closed: threading.Event = field(default_factory=threading.Event)

    @property
    def newest(self) -> int:
        """The newest version served (0 = only the base model)."""
        return self.loaded[-1] if self.loaded else 0

    def load(self, event: WeightVersionEvent) -> LoadReport | None:
        """Serve ``event``'s adapter if it is a newer version of this policy.

        Returns:
            What was loaded, or None when the event is for another policy or not newer than the newest served.

        Raises:
            AdapterVerificationError: the event names no usable version or its URI is unusable (``malformed``), the
                adapter is for another base model, missing, or its bytes do not match the event (not served);
                ``reason`` says which.
            InferenceUnavailableError: the server did not answer the load or failed it (5xx, 408, 429); the
                verified copy is kept for a retry (or :meth:`abandon`).
            InferenceRequestError: the server rejected the load (4xx).
        """
        if event.policy_id != self.policy_id or event.version <= self.newest:
            return None
        started = time.monotonic()
        name = served_name(self.policy_id, event.version)
        if self.closed.is_set():  # neither staged (a successor may stage into the same folder) nor sent
            raise InferenceUnavailableError(f"{name} on {self.server_url}: not loaded, this loader was closed")
        try:
            check_version_event(event)  # the watcher's reader dead-letters these first; direct callers meet them here
        except WeightEventError as exc:
            raise AdapterVerificationError(str(exc), "malformed") from None
        self._check_base(event)
        staged = self._stage_verified(event, name)
        try:
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(staged)})
        except InferenceUnavailableError:
            self.held.add(staged)
            raise
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        self.loaded.append(event.version)
        self.staged[event.version] = staged
        retired: list[int] = []
        while len(self.loaded) > self.keep_versions:
            old = self.loaded.pop(0)
            # The new version is served by now: a failed unload of the oldest must not report it refused (vLLM
            # then serves one version more until it restarts).
            self._unload_quietly(served_name(self.policy_id, old))
            self.retiring.append((time.monotonic(), self.staged.pop(old)))
            retired.append(old)
        self.remove_retired()
        report = LoadReport(event.version, name, staged, time.monotonic() - started, tuple(retired))
        log.info("serving %s (%.2fs); retired %s", name, report.load_s, retired or "none")
        return report

    def abandon(self, event: WeightVersionEvent) -> None:
        """Give ``event``'s version up after a failed load: the copy kept for its retry is unloaded (vLLM may hold it
        after a timed-out load) and retired like a served version's."""
        staged = self.staging_dir / staged_name(self.policy_id, event.version, event.sha256)
        if staged in self.held:
            self.held.remove(staged)
            self._unload_quietly(served_name(self.policy_id, event.version))
            self.retiring.append((time.monotonic(), staged))

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
        self.held.clear()

    def _check_base(self, event: WeightVersionEvent) -> None:
        mismatch = base_mismatch(event, self.base_fingerprint, f"this server serves {self.base_model!r}")
        if mismatch is not None:
            raise AdapterVerificationError(mismatch, "base_model")

    def _stage_verified(self, event: WeightVersionEvent, name: str) -> Path:
        staged = self.staging_dir / staged_name(self.policy_id, event.version, event.sha256)
        if staged in self.held:  # verified by the try whose load failed: load it again, without fetching it again
            self.held.remove(staged)
            self._unload_quietly(name)
            return staged
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
                source=self.source,
                storage_options=self.storage_options,
            )
        except ArtifactIntegrityError as exc:
            raise AdapterVerificationError(f"{name}: {exc}", exc.reason) from None
        except ArtifactError as exc:
            raise AdapterVerificationError(f"{name}: {exc}", "malformed") from None
        except (KafkaClientError, OSError) as exc:  # an unreachable broker, a file system error: may pass
            raise AdapterVerificationError(f"{name}: cannot fetch {event.adapter_uri}: {exc}", "missing") from None
        return staged

    def _unload_quietly(self, name: str) -> None:
        # vLLM refuses to load a name it holds, and holds one whose timed-out load went through; the usual answer is
        # 404 (it never loaded it), which is fine too.
        try:
            self._post("/v1/unload_lora_adapter", {"lora_name": name})
        except InferenceError as exc:
            log.debug("unloading %s: %s", name, exc)

    def close(self) -> None:
        """Send the server nothing more: it stopped, and a successor may already serve at its URL."""
        self.closed.set()

    def _post(self, path: str, payload: dict[str, str]) -> None:
        if self.closed.is_set():
            raise InferenceUnavailableError(f"{path} on {self.server_url}: not sent, this loader was closed")
        try:
            response = httpx.post(
                f"{self.server_url}{path}", json=payload, timeout=self.timeout_s, headers=auth_headers(self.api_key)
            )
        except httpx.HTTPError as exc:
            raise InferenceUnavailableError(
                f"{path} on {self.server_url} failed: {type(exc).__name__}: {exc}"
            ) from None
        status = response.status_code
        if status == 200:
            return
        if status >= 500 or status in _TRANSIENT_STATUS:
            raise InferenceUnavailableError(f"{path} {payload} on {self.server_url}: HTTP {status}: {response.text}")
        raise InferenceRequestError(f"{path} {payload} on {self.server_url}: {response.text}", status)


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
            source=AdapterSource.of(cfg),
            storage_options=cfg.artifacts.storage_options_values(),
            base_model=cfg.model.base_model_id,
            retired_grace_s=cfg.inference.retired_adapter_grace_s,
        )
        self.catch_up_timeout_s = catch_up_timeout_s
        self.pending = PendingVersion()
        self.refused: list[tuple[int, str]] = []
        self.refused_by_reason: dict[str, int] = {}
        self.retries_by_reason: dict[str, int] = {}  # retries scheduled after a transient failure, by category
        self.skipped = 0  # versions never loaded because a newer one superseded them
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
            "Versions refused, by reason: chunk, hash, missing, malformed, base_model, server.",
            lambda: dict(self.refused_by_reason),
            label="reason",
        )
        self.prometheus.counter(
            "distrl_inference_version_retries_by_reason",
            "Loads retried after a failure that may pass, by reason: missing, server.",
            lambda: dict(self.retries_by_reason),
            label="reason",
        )
        self.prometheus.counter(
            "distrl_inference_versions_skipped",
            "Versions never loaded because a newer one was published first.",
            lambda: self.skipped,
        )

    def start(self) -> None:
        """Serve the metrics (``inference.metrics_port``), then follow the topic in the background."""
        self.prometheus.serve(self.cfg.inference.metrics_port, "inference.metrics_port")
        super().start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop following and serving the metrics; a load the thread had not sent yet is never sent."""
        self.loader.close()
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
        # Every server reads the same records: the DLQ writes each bad one once, whichever server reads it first.
        dead_letters = DeadLetterQueue(self.cfg.kafka, self.topics.dlq, f"inference-watcher-{self.source_id}")
        # No group: every server must see every version, so each one reads all partitions itself.
        follower = TopicFollower(
            self.cfg.kafka,
            self.topics.weights,
            WeightVersionEvent,
            client_id=f"inference-watcher-{self.source_id}",
            dead_letters=dead_letters,
            check=check_version_event,
        )
        try:
            follower.start()
            self._catch_up(follower, producer)
            self.caught_up.set()
            while not self._stop.is_set():
                # Everything already fetched is read before a load: a server that fell behind loads only the newest.
                for event in follower.take(timeout_s=self.pending.wait_s(time.monotonic(), 0.5)):
                    self._offer(event)
                due = self.pending.due_event(time.monotonic())
                if due is not None:
                    self._load_pending(due, producer)
                self.loader.remove_retired()
                producer.poll(0)
        finally:
            follower.close()
            dead_letters.close()
            producer.close()

    def _catch_up(self, follower: TopicFollower[WeightVersionEvent], producer: Producer) -> None:
        """Read the backlog, then try only the newest ``keep_versions`` of it (not every version ever published), in
        order; one failing for a reason that may pass is superseded by the next (its retries are the live loop's)."""
        backlog: dict[int, WeightVersionEvent] = {}
        deadline = time.monotonic() + self.catch_up_timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline and not follower.caught_up():
            event = follower.poll(0.5)
            if event is not None and event.policy_id == self.loader.policy_id:
                backlog[event.version] = event
        newest = sorted(backlog)[-self.loader.keep_versions :]
        log.info("weights backlog: %d versions of %s; loading %s", len(backlog), self.loader.policy_id, newest)
        for version in newest:
            if self._stop.is_set():
                return
            self._offer(backlog[version])
            due = self.pending.due_event(time.monotonic())
            if due is not None:
                self._load_pending(due, producer)

    def _offer(self, event: WeightVersionEvent) -> None:
        """Make a newer version of this policy the pending one; count what it supersedes as skipped."""
        if event.policy_id != self.loader.policy_id:
            return
        self.published_version = max(self.published_version, event.version)
        if event.version <= self.loader.newest:
            return
        dropped = self.pending.offer(event, time.monotonic())
        if dropped is not None:
            self.skipped += 1
            self.loader.abandon(dropped)
            log.info("skipping %s v%d: a newer version was published", dropped.policy_id, dropped.version)

    def _load_pending(self, event: WeightVersionEvent, producer: Producer) -> None:
        try:
            report = self.loader.load(event)
        except (AdapterVerificationError, InferenceError) as exc:
            if self.loader.closed.is_set():  # stopped: neither a retry nor a refusal, the version is a successor's
                log.info("%s v%d not loaded: the watcher stopped (%s)", event.policy_id, event.version, exc)
                return
            failure = classify(exc)
            if not failure.transient:
                self.pending.done()
                self._refuse(event, failure.category, str(exc), producer)
                return
            delay = self.pending.failed(time.monotonic())
            if delay is None:
                self.loader.abandon(event)
                tries = self.pending.max_attempts
                self._refuse(event, failure.category, f"{exc} (still failing after {tries} tries)", producer)
                return
            self.retries_by_reason[failure.category] = self.retries_by_reason.get(failure.category, 0) + 1
            log.warning(
                "%s v%d not loaded (%s), retrying in %.0f s: %s",
                event.policy_id,
                event.version,
                failure.category,
                delay,
                exc,
            )
            return
        except Exception as exc:
            # A record nothing above foresaw costs its version, never the watcher: `serve` exits without it.
            log.exception("%s v%d: unexpected failure", event.policy_id, event.version)
            self.pending.done()
            self.loader.abandon(event)
            self._refuse(event, "malformed", f"{type(exc).__name__}: {exc}", producer)
            return
        self.pending.done()
        if report is not None:
            self.prometheus.loaded(report.load_s)
            values = {
                "policy_version": float(report.version),
                "adapter_load_s": report.load_s,
                "loaded_versions": float(len(self.loader.loaded)),
            }
            self._publish(producer, values, {**self._labels(event), "event": "loaded"})

    def _refuse(self, event: WeightVersionEvent, category: str, reason: str, producer: Producer) -> None:
        # A bad version is refused and reported; the server goes on serving what it has.
        log.error("refused %s v%d (%s): %s", event.policy_id, event.version, category, reason)
        self.refused.append((event.version, reason))
        self.refused_by_reason[category] = self.refused_by_reason.get(category, 0) + 1
        self._publish(
            producer,
            {"refused_version": float(event.version)},
            {**self._labels(event), "event": "refused", "category": category, "reason": reason[:500]},
        )

    @staticmethod
    def _labels(event: WeightVersionEvent) -> dict[str, str]:
        return {"policy_id": event.policy_id, "adapter": served_name(event.policy_id, event.version)}

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
