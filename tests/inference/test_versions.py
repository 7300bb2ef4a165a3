"""The weight-version watcher against a real broker and a real vLLM server: hot-load, refusal, retirement."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.artifacts import atomic_dir, dir_size, sha256_dir
from distrl_stream.config import Config, ModelConfig
from distrl_stream.events import MetricEvent, WeightVersionEvent, decode, utc_now
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.logprobs import action_logprobs
from distrl_stream.policy.prompt import build_prompt
from tests.fixtures.vllm import VllmService
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]

CANDIDATES = [f'{{"action_type":"click","index":{i}}}' for i in range(4)] + ['{"action_type":"navigate_back"}']
TARGET = CANDIDATES[2]
PROMPTS = [build_prompt(f"Open item {i}", "\n".join(f"[{j}] item {j}" for j in range(4)), []) for i in range(8)]
SAMPLES = 100


def _sft_adapter(model_dir: Path, out: Path, steps: int = 15) -> Path:
    """A LoRA adapter trained for a few steps toward TARGET, written atomically (as the learner writes them)."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora = ModelConfig()
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraConfig(r=lora.lora_rank, lora_alpha=lora.lora_alpha, target_modules=lora.lora_target_modules),
    )
    target_ids = [*tokenizer(TARGET)["input_ids"], tokenizer.eos_token_id]
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        out_lp = action_logprobs(model, tokenizer, PROMPTS, [target_ids] * len(PROMPTS), [CANDIDATES] * len(PROMPTS))
        loss = -out_lp.logprob.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
    return out


@pytest.fixture(scope="module")
def sft_adapter(vllm_server: VllmService, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sft_adapter(vllm_server.model_dir, tmp_path_factory.mktemp("adapters") / "sft")


@pytest.fixture
def watcher_config(make_config: Callable[..., Config], vllm_server: VllmService) -> Iterator[Config]:
    cfg = make_config(inference={"keep_versions": 2})
    ensure_run_topics(cfg)
    yield cfg
    vllm_server.unload_all_adapters()


def _publish(cfg: Config, version: int, adapter: Path, *, sha256: str | None = None) -> None:
    event = WeightVersionEvent(
        policy_id=cfg.model.policy_id,
        version=version,
        base_model="tiny",
        adapter_uri=adapter.as_uri(),
        sha256=sha256 or sha256_dir(adapter),
        size_bytes=dir_size(adapter),
        created_at=utc_now(),
        learner_step=version * 10,
        trajectories_consumed=version * 100,
    )
    with Producer(cfg.kafka) as producer:
        producer.produce_event(TopicNames(cfg.run).weights, event)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def _served(service: VllmService) -> set[str]:
    return {m["id"] for m in httpx.get(f"{service.url}/v1/models", timeout=10).json()["data"]}


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
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path
) -> None:
    before = await _sample(vllm_server)
    assert {r.version for r in before} == {0}
    watcher = WeightWatcher(watcher_config, vllm_server.url)
    watcher.start()
    try:
        _publish(watcher_config, 1, sft_adapter)
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


def test_tampered_adapter_is_refused_and_reported(
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path, tmp_path: Path
) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(sft_adapter, tampered)
    published_sha = sha256_dir(tampered)
    weights = tampered / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit after publishing
    weights.write_bytes(bytes(data))

    watcher = WeightWatcher(watcher_config, vllm_server.url)
    watcher.start()
    try:
        _publish(watcher_config, 1, tampered, sha256=published_sha)
        _wait_for(lambda: bool(watcher.refused), "the watcher to refuse version 1")
    finally:
        watcher.stop()
    assert watcher.failed is None
    assert watcher.refused[0][0] == 1 and "does not match" in watcher.refused[0][1]
    assert _served(vllm_server) == {"policy-v0"}
    refused = [e for e in _metric_events(watcher_config) if e.labels.get("event") == "refused"]
    assert [e.values["refused_version"] for e in refused] == [1.0]


def test_late_watcher_loads_the_newest_versions_and_retires_beyond_keep(
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path
) -> None:
    for version in (1, 2, 3):
        _publish(watcher_config, version, sft_adapter)  # published before the server's watcher starts
    watcher = WeightWatcher(watcher_config, vllm_server.url)
    watcher.start()
    try:
        _wait_for(watcher.caught_up.is_set, "the backlog to be read")
        _wait_for(lambda: "policy-v3" in _served(vllm_server), "version 3 to be served")
        assert _served(vllm_server) == {"policy-v0", "policy-v2", "policy-v3"}  # keep_versions = 2; v1 never loaded
        _publish(watcher_config, 4, sft_adapter)
        _wait_for(lambda: "policy-v4" in _served(vllm_server), "version 4 to be served")
        # The watcher loads the new version before it retires the oldest (never fewer than keep_versions served).
        _wait_for(lambda: "policy-v2" not in _served(vllm_server), "version 2 to be retired")
        assert _served(vllm_server) == {"policy-v0", "policy-v3", "policy-v4"}
    finally:
        watcher.stop()
    assert watcher.failed is None and watcher.newest_version == 4


def test_prometheus_endpoint_shows_the_served_version_loads_refusals_and_lag(
    vllm_server: VllmService, watcher_config: Config, sft_adapter: Path, tmp_path: Path
) -> None:
    cfg = watcher_config.model_copy(
        update={"inference": watcher_config.inference.model_copy(update={"metrics_port": 0})}
    )
    tampered = tmp_path / "tampered"
    shutil.copytree(sft_adapter, tampered)
    (tampered / "adapter_config.json").write_text("{}")  # changed after publishing: its checksum no longer matches
    watcher = WeightWatcher(cfg, vllm_server.url)
    watcher.start()
    try:
        address = f"127.0.0.1:{watcher.prometheus.port}"
        assert value(scrape(address), "distrl_inference_served_version") == 0
        _publish(cfg, 1, sft_adapter)
        _wait_for(lambda: value(scrape(address), "distrl_inference_served_version") == 1, "version 1 to be served")
        loaded = scrape(address)
        _publish(cfg, 2, tampered, sha256=sha256_dir(sft_adapter))
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
