"""The weight watcher's failures that may pass: which failures are retried (the rest refuse the version at once), the
backoff schedule, skipping to the newest version, and the watcher on a real broker retrying a version whose adapter
shows up late, dropping one a newer version supersedes, and loading only the newest of the versions it fell behind
on. vLLM is a small HTTP server here that answers the load and unload calls as vLLM does (no engine is needed to
decide what to load when)."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from distrl_stream.artifacts import model_fingerprint, publish, sha256_dir, version_event
from distrl_stream.artifacts.transport import H_ARTIFACT, H_PATH, KafkaLocation
from distrl_stream.config import Config, KafkaConfig, ModelConfig
from distrl_stream.errors import (
    AdapterVerificationError,
    InferenceRequestError,
    InferenceUnavailableError,
)
from distrl_stream.events import DeadLetter, MetricEvent, WeightVersionEvent, decode
from distrl_stream.inference import versions
from distrl_stream.inference.versions import (
    RETRY_ATTEMPTS,
    AdapterLoader,
    Failure,
    PendingVersion,
    WeightWatcher,
    classify,
    retry_delay,
)
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from tests.fixtures.http import BackgroundHttpServer, JsonHandler
from tests.monitor.scrape import scrape, value


class FakeLoraServer:
    """vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``: each call is recorded as ``(path's last
    part, lora_name)``; a load answers the next of ``load_statuses`` (200 once they run out), an unload 200 for a
    loaded name and 404 otherwise, as vLLM does, or ``unload_status`` when set. ``hold``: a load of that name waits
    until :meth:`release`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.load_statuses: list[int] = []
        self.unload_status: int | None = None
        self.loaded: set[str] = set()
        self.hold: str | None = None
        self.held = threading.Event()
        self._release = threading.Event()
        fake = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                name = self.read_json()["lora_name"]
                action = self.path.rsplit("/", 1)[-1]
                fake.calls.append((action, name))
                if action == "unload_lora_adapter":
                    found = name in fake.loaded
                    status = fake.unload_status or (200 if found else 404)
                    if status == 200:
                        fake.loaded.discard(name)
                    self.send_json(status, {"error": {"message": f"{name}: answered {status}"}})
                    return
                if name == fake.hold:
                    fake.held.set()
                    fake._release.wait(30)
                status = fake.load_statuses.pop(0) if fake.load_statuses else 200
                if status == 200:
                    fake.loaded.add(name)
                self.send_json(status, {"error": {"message": f"answered {status}"}})

        self.http = BackgroundHttpServer(Handler)
        self.url = self.http.url

    def loads(self) -> list[str]:
        return [name for action, name in self.calls if action == "load_lora_adapter"]

    def release(self) -> None:
        self._release.set()

    def stop(self) -> None:
        self._release.set()
        self.http.stop()


@pytest.fixture
def lora_server() -> Iterator[FakeLoraServer]:
    server = FakeLoraServer()
    yield server
    server.stop()


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    """A folder shaped like a LoRA adapter (the fake server never reads it)."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4)
    return folder


@pytest.fixture
def base_model(tmp_path: Path) -> Path:
    """A folder the watcher fingerprints as its base model."""
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _event(version: int, adapter: Path, uri: str | None = None, fingerprint: str = "") -> WeightVersionEvent:
    return version_event(
        ModelConfig(),
        version,
        adapter,
        adapter_uri=uri or adapter.as_uri(),
        base_fingerprint=fingerprint,
        learner_step=version,
        trajectories_consumed=version,
    )


def _appear(source: Path, target: Path) -> None:
    """Make ``target`` a copy of ``source`` in one rename, as the learner's ``atomic_dir`` does."""
    tmp = target.with_name(f".{target.name}.partial")
    shutil.copytree(source, tmp)
    tmp.rename(target)


# --- which failures may pass ----------------------------------------------------------------------------------------


def test_only_a_missing_adapter_and_a_failing_server_are_worth_retrying() -> None:
    assert classify(AdapterVerificationError("not there yet", "missing")) == Failure("missing", True)
    for reason in ("chunk", "hash", "base_model", "malformed"):
        assert classify(AdapterVerificationError("bad", reason)) == Failure(reason, False)
    assert classify(InferenceUnavailableError("HTTP 503")) == Failure("server", True)
    assert classify(InferenceRequestError("the adapter's config is invalid", 400)) == Failure("server", False)


def test_the_loader_tells_a_server_that_may_recover_from_one_that_rejects_the_adapter(
    lora_server: FakeLoraServer, adapter: Path, tmp_path: Path
) -> None:
    loader = AdapterLoader(lora_server.url, "policy", 2, tmp_path / "staging", timeout_s=10)
    lora_server.load_statuses = [503, 500, 429, 408, 400, 404]
    for version, status in enumerate(lora_server.load_statuses.copy(), start=1):
        expected = InferenceRequestError if status in (400, 404) else InferenceUnavailableError
        with pytest.raises(expected, match=f"HTTP {status}"):
            loader.load(_event(version, adapter))
    unreachable = AdapterLoader("http://127.0.0.1:9", "policy", 2, tmp_path / "staging2", timeout_s=5)
    with pytest.raises(InferenceUnavailableError, match="ConnectError"):
        unreachable.load(_event(1, adapter))


def test_a_missing_adapter_is_missing_and_an_unusable_uri_is_malformed(adapter: Path, tmp_path: Path) -> None:
    loader = AdapterLoader("http://127.0.0.1:9", "policy", 2, tmp_path / "staging")  # never reached
    with pytest.raises(AdapterVerificationError, match="does not exist") as missing:
        loader.load(_event(1, adapter, (tmp_path / "not-yet").as_uri()))
    kafka_uri = "kafka://run.artifacts/0/0-1?artifact=policy/v000001&chunks=2"
    with pytest.raises(AdapterVerificationError, match="needs the cluster's settings") as no_cluster:
        loader.load(_event(1, adapter, kafka_uri))  # this loader has no Kafka settings
    with pytest.raises(AdapterVerificationError, match="malformed kafka artifact URI") as bad_uri:
        AdapterLoader("http://127.0.0.1:9", "policy", 2, tmp_path / "s", kafka=KafkaConfig()).load(
            _event(1, adapter, "kafka://run.artifacts/zero")
        )
    assert (missing.value.reason, no_cluster.value.reason, bad_uri.value.reason) == (
        "missing",
        "malformed",
        "malformed",
    )


def test_a_retried_load_reuses_the_verified_copy_and_frees_the_name_first(
    lora_server: FakeLoraServer, adapter: Path, tmp_path: Path
) -> None:
    source = tmp_path / "learner" / "v1"
    _appear(adapter, source)
    loader = AdapterLoader(lora_server.url, "policy", 2, tmp_path / "staging", timeout_s=10)
    event = _event(1, source)
    lora_server.load_statuses = [503]
    with pytest.raises(InferenceUnavailableError):
        loader.load(event)
    shutil.rmtree(source)  # the learner's folder is gone: a second fetch would fail
    report = loader.load(event)
    assert report is not None and report.path.is_dir() and sha256_dir(report.path) == event.sha256
    # A timed-out load may have gone through, and vLLM refuses a name it already holds: unload (404 here), then load.
    assert lora_server.calls == [
        ("load_lora_adapter", "policy-v1"),
        ("unload_lora_adapter", "policy-v1"),
        ("load_lora_adapter", "policy-v1"),
    ]


def test_a_failed_unload_of_the_retired_version_does_not_fail_the_new_ones_load(
    lora_server: FakeLoraServer, adapter: Path, tmp_path: Path
) -> None:
    loader = AdapterLoader(lora_server.url, "policy", 1, tmp_path / "staging", timeout_s=10, retired_grace_s=0)
    assert loader.load(_event(1, adapter)) is not None
    lora_server.unload_status = 500
    report = loader.load(_event(2, adapter))  # served by now: it must not be reported refused or retried
    assert report is not None and report.retired == (1,)
    assert loader.loaded == [2] and loader.newest == 2
    assert not any(path.name.startswith("policy-v1") for path in (tmp_path / "staging").iterdir())  # copy removed


def test_a_closed_loader_sends_the_server_nothing(lora_server: FakeLoraServer, adapter: Path, tmp_path: Path) -> None:
    loader = AdapterLoader(lora_server.url, "policy", 2, tmp_path / "staging", timeout_s=10)
    loader.load(_event(1, adapter))
    loader.close()
    with pytest.raises(InferenceUnavailableError, match="not loaded, this loader was closed"):
        loader.load(_event(2, adapter))
    assert lora_server.calls == [("load_lora_adapter", "policy-v1")]


def test_an_abandoned_version_is_unloaded_and_its_copy_outlives_the_grace_period_only(
    lora_server: FakeLoraServer, adapter: Path, tmp_path: Path
) -> None:
    loader = AdapterLoader(lora_server.url, "policy", 2, tmp_path / "staging", timeout_s=10, retired_grace_s=60)
    event = _event(1, adapter)
    lora_server.load_statuses = [503]
    with pytest.raises(InferenceUnavailableError):
        loader.load(event)
    [staged] = list((tmp_path / "staging").iterdir())
    loader.abandon(event)
    assert lora_server.calls[-1] == ("unload_lora_adapter", "policy-v1")
    loader.remove_retired()
    assert staged.is_dir()  # vLLM may have loaded it (a timed-out load): it may still read it for a while
    loader.retired_grace_s = 0
    loader.remove_retired()
    assert not staged.exists()
    loader.abandon(event)  # twice: nothing left to do
    assert len(lora_server.calls) == 2


# --- the schedule and the skip to the newest version -------------------------------------------------------------


def test_the_backoff_doubles_up_to_a_minute_and_gives_up_after_about_15_minutes() -> None:
    assert [retry_delay(n) for n in range(1, 9)] == [2, 4, 8, 16, 32, 60, 60, 60]
    assert retry_delay(3, backoff_s=0.5, backoff_max_s=1.5) == 1.5
    assert sum(retry_delay(n) for n in range(1, RETRY_ATTEMPTS)) == 902  # the waits between all the tries


def test_a_pending_version_is_retried_on_schedule_then_given_up(adapter: Path) -> None:
    pending = PendingVersion(backoff_s=1.0, backoff_max_s=4.0, max_attempts=4)
    v1 = _event(1, adapter)
    assert pending.offer(v1, now=100.0) is None
    assert pending.due_event(100.0) is v1 and pending.wait_s(100.0, 0.5) == 0.0
    assert pending.failed(100.0) == 1.0
    assert pending.due_event(100.5) is None and pending.wait_s(100.5, 5.0) == 0.5
    assert pending.due_event(101.0) is v1
    assert [pending.failed(t) for t in (101.0, 103.0)] == [2.0, 4.0]
    assert pending.failed(107.0) is None  # the 4th try failed too: given up
    assert pending.event is None and pending.due_event(1e9) is None and pending.wait_s(107.0, 0.5) == 0.5


def test_only_the_newest_version_is_pending(adapter: Path) -> None:
    pending = PendingVersion(backoff_s=10.0)
    v1, v2, v3 = (_event(v, adapter) for v in (1, 2, 3))
    pending.offer(v1, now=0.0)
    pending.failed(0.0)  # waiting for its retry at t = 10
    assert pending.offer(v2, now=1.0) is v1  # superseded during its backoff
    assert pending.event is v2 and pending.failures == 0 and pending.due_event(1.0) is v2  # due at once
    assert pending.offer(v3, now=1.0) is v2  # several pending (a server behind): only the newest stays
    assert pending.offer(v1, now=1.0) is v1  # an older one never replaces it
    assert pending.offer(v3, now=1.0) is None and pending.event is v3  # the same version again: nothing dropped
    pending.done()
    assert pending.event is None


# --- the watcher on a real broker -------------------------------------------------------------------------------


@pytest.fixture
def watcher_cfg(make_config: Callable[..., Config]) -> Config:
    # The learner's folders are read in place (file://), as by servers on its host or a shared filesystem.
    cfg = make_config(inference={"metrics_port": 0}, artifacts={"store": "file"})
    ensure_run_topics(cfg)
    return cfg


@pytest.fixture
def start_watcher(
    watcher_cfg: Config, lora_server: FakeLoraServer, base_model: Path
) -> Iterator[Callable[..., WeightWatcher]]:
    started: list[WeightWatcher] = []

    def start(cfg: Config = watcher_cfg) -> WeightWatcher:
        started.append(WeightWatcher(cfg, lora_server.url, model_dir=base_model, catch_up_timeout_s=30))
        started[-1].start()
        return started[-1]

    yield start
    for watcher in started:
        watcher.stop()


def _announce(cfg: Config, *events: WeightVersionEvent) -> None:
    with Producer(cfg.kafka) as producer:
        for event in events:
            producer.produce_event(TopicNames(cfg.run).weights, event)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)


def _metric_events(cfg: Config) -> list[tuple[str, str]]:
    records = read_topic(cfg.kafka, TopicNames(cfg.run).metrics, timeout_s=30)
    events = [decode(m.value(), MetricEvent) for m in records]
    return [(e.labels["event"], e.labels["adapter"]) for e in events]


@pytest.mark.kafka
def test_a_version_whose_adapter_appears_after_its_event_is_loaded_by_a_retry(
    watcher_cfg: Config,
    start_watcher: Callable[[], WeightWatcher],
    lora_server: FakeLoraServer,
    adapter: Path,
    base_model: Path,
    tmp_path: Path,
) -> None:
    late = tmp_path / "learner" / "v1"
    late.parent.mkdir()
    event = _event(1, adapter, late.as_uri(), model_fingerprint(base_model))
    _announce(watcher_cfg, event)  # the weights topic is compacted: this is the only record of v1 there will be
    watcher = start_watcher()
    _wait_for(watcher.caught_up.is_set, "the backlog to be read")  # v1's first try failed in the catch-up
    assert lora_server.loads() == [] and watcher.newest_version == 0
    _appear(adapter, late)
    _wait_for(lambda: watcher.newest_version == 1, "version 1 to be loaded by a retry")
    metrics = scrape(f"127.0.0.1:{watcher.prometheus.port}")
    watcher.stop()  # its state settles, and its producer flushes the metric events
    assert watcher.failed is None and watcher.refused == [] and lora_server.loads() == ["policy-v1"]
    assert watcher.retries_by_reason["missing"] >= 1
    assert value(metrics, "distrl_inference_version_retries_by_reason_total", reason="missing") >= 1
    assert value(metrics, "distrl_inference_versions_refused_total") == 0
    assert _metric_events(watcher_cfg) == [("loaded", "policy-v1")]


@pytest.mark.kafka
def test_a_newer_version_supersedes_one_waiting_for_its_retry(
    watcher_cfg: Config,
    start_watcher: Callable[[], WeightWatcher],
    lora_server: FakeLoraServer,
    adapter: Path,
    tmp_path: Path,
) -> None:
    _announce(watcher_cfg, _event(1, adapter, (tmp_path / "never").as_uri()))
    watcher = start_watcher()
    _wait_for(watcher.caught_up.is_set, "the backlog to be read")
    _announce(watcher_cfg, _event(2, adapter))  # while v1 waits for its retry
    _wait_for(lambda: watcher.newest_version == 2, "version 2 to be loaded")
    metrics = scrape(f"127.0.0.1:{watcher.prometheus.port}")
    watcher.stop()
    assert watcher.failed is None and watcher.refused == [] and lora_server.loads() == ["policy-v2"]
    assert watcher.skipped == 1 and watcher.pending.event is None
    assert value(metrics, "distrl_inference_versions_skipped_total") == 1
    assert _metric_events(watcher_cfg) == [("loaded", "policy-v2")]


@pytest.mark.kafka
def test_a_server_that_fell_behind_loads_only_the_newest_version(
    watcher_cfg: Config, start_watcher: Callable[[], WeightWatcher], lora_server: FakeLoraServer, adapter: Path
) -> None:
    watcher = start_watcher()
    _wait_for(watcher.caught_up.is_set, "the (empty) backlog to be read")
    lora_server.hold = "policy-v1"  # a slow load: versions 2-4 are published meanwhile
    _announce(watcher_cfg, _event(1, adapter))
    _wait_for(lora_server.held.is_set, "version 1's load to start")
    _announce(watcher_cfg, *(_event(v, adapter) for v in (2, 3, 4)))
    time.sleep(3.0)  # the watcher's consumer fetches them while the load of v1 is held
    lora_server.release()
    _wait_for(lambda: watcher.newest_version == 4, "version 4 to be loaded")
    watcher.stop()
    assert watcher.failed is None and watcher.refused == []
    assert lora_server.loads() == ["policy-v1", "policy-v4"] and watcher.skipped == 2
    assert watcher.loader.loaded == [1, 4]
    assert _metric_events(watcher_cfg) == [("loaded", "policy-v1"), ("loaded", "policy-v4")]


# --- records a server must neither fetch nor die of ---------------------------------------------------------------


def _kafka_store(cfg: Config) -> Config:
    return cfg.model_copy(update={"artifacts": cfg.artifacts.model_copy(update={"store": "kafka"})})


@pytest.mark.kafka
def test_an_adapter_outside_artifacts_store_is_refused_without_being_fetched(
    watcher_cfg: Config, start_watcher: Callable[..., WeightWatcher], lora_server: FakeLoraServer, adapter: Path
) -> None:
    cfg = _kafka_store(watcher_cfg)
    _announce(cfg, _event(1, adapter))  # a file:// folder, while the learner publishes to Kafka
    watcher = start_watcher(cfg)
    _wait_for(lambda: watcher.refused != [], "version 1 to be refused")
    watcher.stop()
    assert watcher.failed is None and lora_server.loads() == []
    [(version, why)] = watcher.refused
    assert version == 1 and f"is outside artifacts.store 'kafka' (kafka://{TopicNames(cfg.run).artifacts}/…)" in why
    assert watcher.refused_by_reason == {"malformed": 1}


@pytest.mark.kafka
def test_a_chunk_with_unreadable_headers_costs_its_version_never_the_watcher(
    watcher_cfg: Config, start_watcher: Callable[..., WeightWatcher], lora_server: FakeLoraServer, adapter: Path
) -> None:
    cfg = _kafka_store(watcher_cfg)
    topic = TopicNames(cfg.run).artifacts
    offsets: list[int] = []
    with Producer(cfg.kafka) as producer:
        headers = [(H_ARTIFACT, b"policy/v000001"), (H_PATH, b"\xff\xfe")]  # not UTF-8
        producer.produce(
            topic,
            b"x",
            "policy/s1/000000",
            headers=headers,
            partition=0,
            on_delivery=lambda e, m: offsets.append(m.offset()),
        )
        producer.flush()
        good = publish(cfg, 2, adapter, producer)
    bad = KafkaLocation(topic, 0, offsets[0], offsets[0], "policy/v000001", 1).uri
    _announce(cfg, _event(1, adapter, bad))
    watcher = start_watcher(cfg)
    _wait_for(lambda: watcher.refused != [], "version 1 to be refused")
    _announce(cfg, _event(2, adapter, good))
    _wait_for(lambda: watcher.newest_version == 2, "version 2 to be loaded after the bad one")
    watcher.stop()
    assert watcher.failed is None and lora_server.loads() == ["policy-v2"]
    assert watcher.refused_by_reason == {"chunk": 1} and "not UTF-8: distrl-path" in watcher.refused[0][1]


@pytest.mark.kafka
def test_an_impossible_version_event_is_dead_lettered_with_its_reason_and_skipped(
    watcher_cfg: Config, start_watcher: Callable[..., WeightWatcher], lora_server: FakeLoraServer, adapter: Path
) -> None:
    _announce(watcher_cfg, dataclasses.replace(_event(1, adapter), sha256="not-a-digest"), _event(2, adapter))
    watcher = start_watcher()
    _wait_for(lambda: watcher.newest_version == 2, "version 2 to be loaded")
    watcher.stop()
    assert watcher.failed is None and watcher.refused == [] and lora_server.loads() == ["policy-v2"]
    records = read_topic(watcher_cfg.kafka, TopicNames(watcher_cfg.run).dlq, timeout_s=30)
    letters = [decode(m.value(), DeadLetter) for m in records]
    why = "impossible value: weight version policy v1: sha256 'not-a-digest' is not 64 hex digits"
    assert [(letter.offset, letter.error_message) for letter in letters] == [(0, why)]


@pytest.mark.kafka
def test_a_watcher_stopped_in_the_middle_of_a_fetch_loads_nothing_when_the_fetch_ends(
    watcher_cfg: Config,
    start_watcher: Callable[[], WeightWatcher],
    lora_server: FakeLoraServer,
    adapter: Path,
    base_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `serve` restarts a dead vLLM at the same URL with a new watcher: the old one's thread, still fetching past
    # stop()'s join, must not load into it.
    fetching, release = threading.Event(), threading.Event()

    def slow_fetch(*args: object, **kwargs: object) -> None:
        fetching.set()
        release.wait(30)
        real_fetch(*args, **kwargs)

    real_fetch = versions.fetch
    monkeypatch.setattr(versions, "fetch", slow_fetch)
    watcher = start_watcher()
    _announce(watcher_cfg, _event(1, adapter, fingerprint=model_fingerprint(base_model)))
    _wait_for(fetching.is_set, "the watcher to fetch version 1")
    thread = watcher._thread
    assert thread is not None
    watcher.stop(timeout_s=0.2)
    assert thread.is_alive()  # past the join: still in the fetch
    release.set()
    thread.join(30)
    assert not thread.is_alive() and lora_server.calls == []
    # Neither retried nor refused: the version is the next watcher's to load.
    assert watcher.retries_by_reason == {} and watcher.refused == []
