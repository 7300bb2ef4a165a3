"""The async client against a real vLLM server: choice and free mode, agreement with the learner, failures."""

from __future__ import annotations

import asyncio
import random
import statistics
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from distrl_stream.config import InferenceConfig
from distrl_stream.errors import InferenceError, InferenceRequestError, InferenceUnavailableError
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.policy.logprobs import ChoiceConstraint, action_logprobs
from distrl_stream.policy.prompt import build_prompt
from distrl_stream.processes import free_port
from tests.fixtures.vllm import VllmService

# bf16 on the server vs fp32 here: the bound on the mean |gap| per action.
MAX_MEAN_GAP = 0.05

LABELS = ["Wi-Fi", "Bluetooth", "Display", "Battery", "Sound", "Apps", "Search", "Back"]


def _case(rng: random.Random) -> tuple[str, list[str]]:
    labels = rng.sample(LABELS, rng.randint(2, 6))
    screen = "\n".join(f"[{i}] button {label}" for i, label in enumerate(labels))
    candidates = [f'{{"action_type":"click","index":{i}}}' for i in range(len(labels))]
    candidates += ['{"action_type":"navigate_back"}', '{"action_type":"type","text":"' + rng.choice(LABELS) + '"}']
    history = rng.sample(candidates, rng.randint(0, 3))
    return build_prompt(f"Open {rng.choice(labels)} settings", screen, history), candidates


@pytest.fixture(scope="module")
def learner(vllm_server: VllmService) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(vllm_server.model_dir)


def _gaps(
    learner: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[str],
    results: list[ActionResult],
    candidates: list[list[str]] | None,
) -> list[float]:
    model, tokenizer = learner
    constraint = ChoiceConstraint(tokenizer, model.config.vocab_size) if candidates else None
    gaps: list[float] = []
    with torch.no_grad():
        for start in range(0, len(prompts), 50):
            chunk = slice(start, start + 50)
            out = action_logprobs(
                model,
                tokenizer,
                prompts[chunk],
                [r.token_ids for r in results[chunk]],
                candidates[chunk] if candidates else None,
                constraint=constraint,
            )
            served = torch.tensor([r.logprob for r in results[chunk]])
            gaps += (out.logprob - served).abs().tolist()
    return gaps


@pytest.mark.vllm
async def test_200_choice_actions_are_candidates_and_match_learner_log_probs(
    vllm_server: VllmService,
    learner: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    record_property: pytest.RecordProperty,
) -> None:
    rng = random.Random(0)
    cases = [_case(rng) for _ in range(200)]
    async with InferenceClient(vllm_server.inference, vllm_server.policy_id) as client:
        results = await asyncio.gather(*(client.act(p, c, mode="choice") for p, c in cases))
    prompts, candidates = [p for p, _ in cases], [c for _, c in cases]
    assert all(r.text in c for r, c in zip(results, candidates, strict=True))
    assert len({r.text for r in results}) > 5  # sampled, not a constant answer
    assert {(r.version, r.model, r.finish_reason) for r in results} == {(0, "policy-v0", "stop")}
    _, tokenizer = learner
    assert all(list(r.prompt_token_ids) == tokenizer(p)["input_ids"] for r, p in zip(results, prompts, strict=True))
    assert all(r.token_ids[-1] == tokenizer.eos_token_id for r in results)
    assert all(abs(r.logprob - sum(r.token_logprobs)) < 1e-9 for r in results)
    gaps = _gaps(learner, prompts, results, candidates)
    record_property("choice_mean_abs_gap_nats", statistics.fmean(gaps))
    print(f"choice mode: mean |gap| {statistics.fmean(gaps):.4f} nats, max {max(gaps):.4f} over {len(gaps)} actions")
    assert statistics.fmean(gaps) < MAX_MEAN_GAP


@pytest.mark.vllm
async def test_free_mode_log_probs_match_the_learner_on_raw_log_probs(
    vllm_server: VllmService,
    learner: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    record_property: pytest.RecordProperty,
) -> None:
    rng = random.Random(1)
    prompts = [_case(rng)[0] for _ in range(50)]
    cfg = vllm_server.inference.model_copy(update={"max_tokens": 24})
    async with InferenceClient(cfg, vllm_server.policy_id) as client:
        results = await asyncio.gather(*(client.act(p, mode="free") for p in prompts))
    assert all(r.mode == "free" and 1 <= len(r.token_ids) <= 24 for r in results)
    gaps = _gaps(learner, prompts, results, None)
    record_property("free_mean_abs_gap_nats", statistics.fmean(gaps))
    print(f"free mode: mean |gap| {statistics.fmean(gaps):.4f} nats, max {max(gaps):.4f} over {len(gaps)} actions")
    assert statistics.fmean(gaps) < MAX_MEAN_GAP


@pytest.mark.vllm
async def test_a_rejected_request_is_not_retried(vllm_server: VllmService) -> None:
    too_long = build_prompt("x", "word " * 5000, [], max_observation_chars=20_000)
    async with InferenceClient(vllm_server.inference, vllm_server.policy_id) as client:
        with pytest.raises(InferenceRequestError) as info:
            await client.act(too_long, ['{"action_type":"wait"}'])
        with pytest.raises(InferenceError, match="at least one candidate"):
            await client.act("prompt", [], mode="choice")
    assert info.value.status_code == 400


async def test_a_stopped_server_fails_fast_with_a_typed_error() -> None:
    port = free_port()  # nothing listens there: the state of a stopped server
    cfg = InferenceConfig(port=port, retries=2, retry_backoff_s=0.05, request_timeout_s=1.0)
    async with InferenceClient(cfg) as client:
        # The deadline is the test's, generous: the client must give up by itself, well before it.
        with pytest.raises(InferenceUnavailableError, match="3 attempts"):
            await asyncio.wait_for(client.act("prompt", ['{"action_type":"wait"}']), timeout=30)


async def test_a_hung_server_times_out_after_bounded_retries() -> None:
    connections = 0

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read()  # hold the connection open, answer nothing

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = InferenceConfig(port=port, retries=1, retry_backoff_s=0.05, request_timeout_s=0.5)
    try:
        async with InferenceClient(cfg) as client:
            with pytest.raises(InferenceUnavailableError, match=r"2 attempts.*Timeout"):
                await asyncio.wait_for(client.refresh_versions(), timeout=30)
    finally:
        server.close()
    assert connections == 2


def test_client_module_does_not_import_torch() -> None:
    # Collectors import the client; it must stay light (no torch, no transformers).
    import subprocess
    import sys

    code = "import sys, distrl_stream.inference.client; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout.strip() == "False"
