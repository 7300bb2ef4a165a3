"""The weight-version watcher against a real broker and a real vLLM server: hot-load from {run}.artifacts, refusal
(corrupted chunk, wrong hash, wrong base model) while the last good version stays served, catch-up with an empty data
dir, retirement, and the staging contract (vLLM's /v1/models ``root`` ends with the adapter's sha256)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.artifacts import dir_size, model_fingerprint, publish, sha256_dir
from distrl_stream.artifacts.transport import iter_chunks, publish_chunks
from distrl_stream.config import Config
from distrl_stream.events import MetricEvent, WeightVersionEvent, decode, utc_now
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.logprobs import action_logprobs
from distrl_stream.policy.prompt import build_prompt
from tests.fixtures.vllm import VllmService, train_sft_adapter
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]

CANDIDATES = [f'{{"action_type":"click","index":{i}}}' for i in range(4)] + ['{"action_type":"navigate_back"}']
TARGET = CANDIDATES[2]
PROMPTS = [build_prompt(f"Open item {i}", "\n".join(f"[{j}] item {j}" for j in range(4)), []) for i in range(8)]
SAMPLES = 100


@pytest.fixture(scope="module")
def sft_adapter(vllm_server: VllmService, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    target_ids = [*tokenizer(TARGET)["input_ids"], tokenizer.eos_token_id]
    out = tmp_path_factory.mktemp("adapters") / "sft"
    n = len(PROMPTS)
    return train_sft_adapter(vllm_server.model_dir, out, PROMPTS, [target_ids] * n, [CANDIDATES] * n, steps=15, lr=1e-2)


@pytest.fixture(scope="module")
def base_fingerprint(vllm_server: VllmService) -> str:
    return model_fingerprint(vllm_server.model_dir)


@pytest.fixture
def watcher_config(make_config: Callable[..., Config], vllm_server: VllmService) -> Iterator[Config]:
    cfg = make_config(inference={"keep_versions": 2})
    ensure_run_topics(cfg)
    yield cfg
    vllm_server.unload_all_adapters()


@pytest.fixture
def metrics_config(watcher_config: Config) -> Config:
    """``watcher_config`` with the watcher's Prometheus endpoint on a free port."""
    return watcher_config.model_copy(
        update={"inference": watcher_config.inference.model_copy(update={"metrics_port": 0})}
    )


def _watcher(cfg: Config, service: VllmService) -> WeightWatcher:
    return WeightWatcher(cfg, service.url, model_dir=service.model_dir)


def _publish(
    cfg: Config,
    version: int,
    adapter: Path,
    fingerprint: str,
    *,
    sha256: str | None = None,
    corrupt_chunk: int | None = None,
) -> WeightVersionEvent:
    """Publish ``adapter`` as the learner does (chunks on {run}.artifacts, then the event); ``corrupt_chunk``: that
    chunk's bytes are damaged after its sha256 was taken."""
    with Producer(cfg.kafka) as producer:
        if corrupt_chunk is None:
            uri = publish(cfg, version, adapter, producer)
        else:
            chunks = list(iter_chunks(adapter, cfg.artifacts.chunk_bytes))
            bad = chunks[corrupt_chunk]
            chunks[corrupt_chunk] = dataclasses.replace(bad, data=bytes([bad.data[0] ^ 1]) + bad.data[1:])
            uri = publish_chunks(cfg, producer, version, iter(chunks)).uri
        event = WeightVersionEvent(
            policy_id=cfg.model.policy_id,
            version=version,
            base_model="tiny",
            adapter_uri=uri,
            sha256=sha256 or sha256_dir(adapter),
            size_bytes=dir_size(adapter),
            created_at=utc_now(),
            learner_step=version * 10,
            trajectories_consumed=version * 100,
            base_fingerprint=fingerprint,
        )
        producer.produce_event(TopicNames(cfg.run).weights, event)
    return event


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def _models(service: VllmService) -> dict[str, str]:
    """Served name -> root (the base model's folder, or the folder a LoRA adapter was loaded from)."""
    return {m["id"]: m["root"] for m in httpx.get(f"{service.url}/v1/models", timeout=10).json()["data"]}


def _served(service: VllmService) -> set[str]:
    return set(_models(service))


def _metric_events(cfg: Config) -> list[MetricEvent]:
    return [decode(m.value(), MetricEvent) for m in read_topic(cfg.kafka, TopicNames(cfg.run).metrics, timeout_s=30)]


async def _sample(service: VllmService, mode: str = "choice", n: int = SAMPLES) -> list[ActionResult]:
    cfg = service.inference.model_copy(update={"max_tokens": 16})
    async with InferenceClient(cfg, service.policy_id) as client:
        await client.refresh_versions()
        return await asyncio.gather(
            *(client.act(PROMPTS[i % len(PROMPTS)], CANDIDATES, mode=mode) for i in range(n))  # type: ignore[arg-type]
        )


async def test_published_version_is_hot_loaded_and_shifts_the_served_distribution(
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path, base_fingerprint: str
) -> None:
    before = await _sample(vllm_server)
    assert {r.version for r in before} == {0}
    watcher = _watcher(watcher_config, vllm_server)
    watcher.start()
    try:
        _publish(watcher_config, 1, sft_adapter, base_fingerprint)
        _wait_for(lambda: "policy-v1" in _served(vllm_server), "version 1 to be served")
        after = await _sample(vllm_server)
        free = await _sample(vllm_server, "free", 40)
    finally:
        watcher.stop()
    assert watcher.failed is None
    assert {(r.version, r.model) for r in after + free} == {(1, "policy-v1")}
    share_before = sum(r.text == TARGET for r in before) / SAMPLES
    share_after = sum(r.text == TARGET for r in after) / SAMPLES
    print(f"share of the SFT target: {share_before:.2f} at v0 -> {share_after:.2f} at v1")
    # Untrained: one of 5 candidates; after 15 SFT steps measured ≈0.95 on the target.
    assert share_before < 0.4 < 0.8 < share_after

    # The learner, holding the same adapter, recomputes what v1 served: peft's LoRA = vLLM's LoRA. Free-mode text
    # visits many tokens the adapter was not trained on, so this is not a saturated (all log p ≈ 0) comparison.
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    base = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, sft_adapter).eval()
    with torch.no_grad():
        out = action_logprobs(
            model, tokenizer, [PROMPTS[i % len(PROMPTS)] for i in range(40)], [r.token_ids for r in free]
        )
    served = torch.tensor([r.logprob for r in free])
    gap = (out.logprob - served).abs().mean().item()
    print(f"LoRA v1 free mode: mean |gap| {gap:.4f} nats, mean log p {served.mean():.2f}")
    assert served.mean() < -5  # far from saturated
    assert gap < 0.05

    loaded = [e for e in _metric_events(watcher_config) if e.labels.get("event") == "loaded"]
    assert [(e.role, e.values["policy_version"], e.labels["adapter"]) for e in loaded] == [
        ("inference", 1.0, "policy-v1")
    ]


def test_bad_versions_are_refused_by_reason_and_the_last_good_one_stays_served(
    vllm_server: VllmService, metrics_config: Config, sft_adapter: Path, base_fingerprint: str, tmp_path: Path
) -> None:
    cfg = metrics_config
    tampered = tmp_path / "tampered"
    shutil.copytree(sft_adapter, tampered)
    weights = tampered / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit after the learner hashed the folder
    weights.write_bytes(bytes(data))
    watcher = _watcher(cfg, vllm_server)
    watcher.start()
    try:
        _publish(cfg, 1, sft_adapter, base_fingerprint)
        _wait_for(lambda: "policy-v1" in _served(vllm_server), "version 1 to be served")
        # One at a time: a version published while an older one is still pending supersedes it (never tried).
        _publish(cfg, 2, sft_adapter, base_fingerprint, corrupt_chunk=1)
        _wait_for(lambda: len(watcher.refused) == 1, "version 2 to be refused")
        _publish(cfg, 3, tampered, base_fingerprint, sha256=sha256_dir(sft_adapter))
        _wait_for(lambda: len(watcher.refused) == 2, "version 3 to be refused")
        _publish(cfg, 4, sft_adapter, "f" * 64)  # trained on another base model
        _wait_for(lambda: len(watcher.refused) == 3, "version 4 to be refused")
        assert _served(vllm_server) == {"policy-v0", "policy-v1"}
        metrics = scrape(f"127.0.0.1:{watcher.prometheus.port}")
    finally:
        watcher.stop()
    assert watcher.failed is None and watcher.newest_version == 1
    [(v2, chunk), (v3, whole), (v4, base)] = watcher.refused
    assert (v2, v3, v4) == (2, 3, 4)
    assert "chunk adapter_config.json@0 does not match its sha256" in chunk
    assert "does not match its weight-version event" in whole
    assert "adapter for base model 'tiny' (fingerprint ffffffffffffffff…) but this server serves 'tiny' " in base
    assert f"(fingerprint {base_fingerprint[:16]}…)" in base and "\n" not in base
    refused = [e for e in _metric_events(cfg) if e.labels.get("event") == "refused"]
    assert [(e.values["refused_version"], e.labels["category"]) for e in refused] == [
        (2.0, "chunk"),
        (3.0, "hash"),
        (4.0, "base_model"),
    ]
    server = {"run": cfg.run, "role": "inference", "source": watcher.source_id}
    for reason in ("chunk", "hash", "base_model"):
        assert value(metrics, "distrl_inference_versions_refused_by_reason_total", **server, reason=reason) == 1
    assert value(metrics, "distrl_inference_served_version", **server) == 1


def test_a_server_with_an_empty_data_dir_catches_up_from_kafka_and_retires_beyond_keep(
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path, base_fingerprint: str, tmp_path: Path
) -> None:
    events = {v: _publish(watcher_config, v, sft_adapter, base_fingerprint) for v in (1, 2, 3)}
    # Nothing on this "host" but the broker: a fresh data dir, no access to the learner's files.
    fresh = watcher_config.model_copy(update={"data_dir": tmp_path / "empty"})
    watcher = _watcher(fresh, vllm_server)
    watcher.start()
    try:
        _wait_for(watcher.caught_up.is_set, "the backlog to be read")
        _wait_for(lambda: "policy-v3" in _served(vllm_server), "version 3 to be served")
        assert _served(vllm_server) == {"policy-v0", "policy-v2", "policy-v3"}  # keep_versions = 2; v1 never loaded
        # The staging contract: vLLM reports the adapter's folder as its root; the name ends with its sha256.
        root = Path(_models(vllm_server)["policy-v3"])
        assert root.name == f"policy-v3-{events[3].sha256}" and root.is_relative_to(tmp_path / "empty")
        assert sha256_dir(root) == events[3].sha256
        events[4] = _publish(watcher_config, 4, sft_adapter, base_fingerprint)
        _wait_for(lambda: "policy-v4" in _served(vllm_server), "version 4 to be served")
        # The watcher loads the new version before it retires the oldest (never fewer than keep_versions served).
        _wait_for(lambda: "policy-v2" not in _served(vllm_server), "version 2 to be retired")
        assert _served(vllm_server) == {"policy-v0", "policy-v3", "policy-v4"}
        # A request accepted under policy-v2 before the unload may still make vLLM reload it from its folder (and a
        # missing folder kills vLLM's engine), so the retired copy outlives the unload by retired_adapter_grace_s.
        staged = sorted(p.name for p in root.parent.iterdir())
        assert staged == sorted(f"policy-v{v}-{events[v].sha256}" for v in (2, 3, 4))
    finally:
        watcher.stop()
    assert watcher.failed is None and watcher.newest_version == 4
    watcher.loader.retired_grace_s = 0.0
    watcher.loader.remove_retired()
    assert sorted(p.name for p in root.parent.iterdir()) == sorted(
        f"policy-v{v}-{events[v].sha256}" for v in (3, 4)
    )  # once the grace period is over, the retired version's staged copy is gone


def test_prometheus_endpoint_shows_the_served_version_loads_refusals_and_lag(
    vllm_server: VllmService, metrics_config: Config, sft_adapter: Path, base_fingerprint: str, tmp_path: Path
) -> None:
    cfg = metrics_config
    tampered = tmp_path / "tampered"
    shutil.copytree(sft_adapter, tampered)
    (tampered / "adapter_config.json").write_text("{}")  # changed after publishing: its checksum no longer matches
    watcher = _watcher(cfg, vllm_server)
    watcher.start()
    try:
        address = f"127.0.0.1:{watcher.prometheus.port}"
        assert value(scrape(address), "distrl_inference_served_version") == 0
        _publish(cfg, 1, sft_adapter, base_fingerprint)
        _wait_for(lambda: value(scrape(address), "distrl_inference_served_version") == 1, "version 1 to be served")
        loaded = scrape(address)
        _publish(cfg, 2, tampered, base_fingerprint, sha256=sha256_dir(sft_adapter))
        _wait_for(lambda: value(scrape(address), "distrl_inference_versions_refused_total") == 1, "version 2 refused")
        refused = scrape(address)
    finally:
        watcher.stop()
    server = {"run": cfg.run, "role": "inference", "source": watcher.source_id}
    assert value(loaded, "distrl_inference_version_loads_total", **server) == 1
    assert value(loaded, "distrl_inference_adapter_load_seconds_count", **server) == 1
    assert value(loaded, "distrl_inference_version_lag", **server) == 0
    assert value(refused, "distrl_inference_served_version", **server) == 1
    assert value(refused, "distrl_inference_published_version", **server) == 2
    assert value(refused, "distrl_inference_version_lag", **server) == 1
    assert value(refused, "distrl_inference_loaded_versions", **server) == 1
