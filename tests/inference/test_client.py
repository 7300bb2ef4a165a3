"""The async client: against a real vLLM server (choice and free mode, agreement with the learner, failures), and
its server pool against small HTTP servers started by the tests (least in flight, failover, backoff)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from distrl_stream.config import InferenceConfig
from distrl_stream.errors import InferenceError, InferenceRequestError, InferenceUnavailableError
from distrl_stream.inference.client import InferenceClient, root_sha256
from distrl_stream.policy.prompt import IMAGE_PART, ImagePrompt, build_messages, build_prompt
from distrl_stream.processes import free_port
from distrl_stream.testing.parity import logprob_gaps
from tests.fixtures.http import BackgroundHttpServer, JsonHandler
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
    gaps = logprob_gaps(*learner, prompts, results, candidates)
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
    gaps = logprob_gaps(*learner, prompts, results)
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


@pytest.mark.vllm
async def test_an_answer_cut_off_by_the_context_limit_names_the_prompt_length(vllm_server: VllmService) -> None:
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    limit = vllm_server.inference.max_model_len

    def prompt(words: int) -> str:
        return build_prompt("x", "word " * words, [], max_observation_chars=20_000)

    # The longest prompt that still fits with 2 tokens to spare: vLLM accepts it and stops the answer at the limit.
    words = next(n for n in range(limit, 0, -1) if len(tokenizer(prompt(n)).input_ids) <= limit - 2)
    candidate = '{"action_type":"type","text":"' + "a long answer " * 4 + '"}'
    async with InferenceClient(vllm_server.inference, vllm_server.policy_id) as client:
        with pytest.raises(InferenceError) as info:
            await client.act(prompt(words), [candidate])
    said = re.search(
        r"cut off at the server's context limit after (\d+) answer tokens, the prompt having taken "
        r"(\d+) of (\d+) ",
        str(info.value),
    )
    assert said is not None, info.value
    answer, prompt_tokens, context = map(int, said.groups())
    assert context == limit == answer + prompt_tokens and answer < 20, info.value


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


# --- the server pool, against small real HTTP servers started here -------------------------------------------------

SHA = {1: "1" * 64, 2: "2" * 64}
PROMPT_IDS = [1, 2, 3]


class FakePolicyServer:
    """An HTTP server speaking the calls of vLLM's API the client uses, with a listing and a failure switch.

    ``/v1/models`` lists ``policy-v0`` and ``policy-v<N>`` for each N of ``versions`` (rooted at
    ``/staging/policy-v<N>-<sha256>``); ``/v1/completions`` and ``/v1/chat/completions`` answer the first candidate
    with the model asked for, each in its own shape. ``posted``: every POST's (path, body). ``status``: the HTTP
    status of completions (500 simulates a failing engine); ``finish_reason``: the one it answers with ("abort"
    simulates a server stopping mid-answer); ``answers_as``: the model its answers name (default: the one asked for);
    ``hold``: set to make completions wait until it is cleared.
    """

    def __init__(self, versions: Sequence[int]) -> None:
        self.versions = list(versions)
        self.status = 200
        self.finish_reason = "stop"
        self.answers_as: str | None = None
        self.completions = 0
        self.posted: list[tuple[str, Any]] = []
        self.hold = threading.Event()
        self.release = threading.Event()
        self.release.set()
        fake = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                data = [{"id": "policy-v0", "root": "/models/tiny"}] + [
                    {"id": f"policy-v{v}", "root": f"/staging/policy-v{v}-{SHA[v]}"} for v in fake.versions
                ]
                self.send_json(200, {"object": "list", "data": data})

            def do_POST(self) -> None:
                body = self.read_json()
                fake.completions += 1
                fake.posted.append((self.path, body))
                if fake.hold.is_set():
                    fake.release.wait(30)
                if fake.status != 200:
                    self.send_json(fake.status, {"error": {"message": "engine dead"}})
                    return
                text = body["structured_outputs"]["choice"][0]
                if fake.finish_reason == "abort":
                    text = text[: len(text) // 2]  # what vLLM returns for a request it aborted: a truncated answer
                model = fake.answers_as or body["model"]
                if self.path == "/v1/chat/completions":
                    pieces = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]
                    choice = {
                        "message": {"role": "assistant", "content": text},
                        "token_ids": [5, 6],
                        "logprobs": {"content": pieces},
                        "finish_reason": fake.finish_reason,
                    }
                    self.send_json(200, {"model": model, "choices": [choice], "prompt_token_ids": PROMPT_IDS})
                    return
                choice = {
                    "text": text,
                    "token_ids": [5, 6],
                    "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25]},
                    "prompt_token_ids": PROMPT_IDS,
                    "finish_reason": fake.finish_reason,
                }
                self.send_json(200, {"model": model, "choices": [choice]})

        self.http = BackgroundHttpServer(Handler)
        self.url = self.http.url

    def hold_requests(self) -> None:
        self.release.clear()
        self.hold.set()

    def release_requests(self) -> None:
        self.hold.clear()
        self.release.set()

    def stop(self) -> None:
        self.release_requests()
        self.http.stop()


@pytest.fixture
def fake_servers() -> Iterator[Callable[[Sequence[int]], FakePolicyServer]]:
    started: list[FakePolicyServer] = []

    def start(versions: Sequence[int]) -> FakePolicyServer:
        started.append(FakePolicyServer(versions))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _pool_cfg(*servers: FakePolicyServer, **overrides: Any) -> InferenceConfig:
    settings: dict[str, Any] = {
        "urls": [s.url for s in servers],
        "retries": 0,
        "request_timeout_s": 5.0,
        "server_backoff_s": 60.0,
        **overrides,
    }
    return InferenceConfig(**settings)


CHOICES = ['{"action_type":"wait"}', '{"action_type":"navigate_back"}']


def test_root_sha256_reads_the_trailing_64_hex_digits_of_the_staging_folder() -> None:
    assert root_sha256(f"/data/serving/gpu-0/policy-v3-{'ab' * 32}") == "ab" * 32
    assert root_sha256(f"/data/serving/gpu-0/policy-v3-{'ab' * 32}/") == "ab" * 32
    assert root_sha256("/data/serving/gpu-0/policy-v3") is None  # staged without a hash: none is made up
    assert root_sha256(f"/data/{'ab' * 32}/policy-v3") is None  # only the folder's own name counts
    assert root_sha256("") is None


async def test_each_request_goes_to_the_server_with_the_fewest_in_flight_and_records_its_adapter(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    first, second = fake_servers([1, 2]), fake_servers([1])
    async with InferenceClient(_pool_cfg(first, second)) as client:
        await client.refresh_versions()
        first.hold_requests()
        held = asyncio.create_task(client.act("prompt", CHOICES))
        deadline = time.monotonic() + 30
        while first.completions == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert client.servers[0].in_flight == 1
        other = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
        first.release_requests()
        answered = await asyncio.wait_for(held, 30)
    # Each answer carries the newest version of the server that gave it, with that server's adapter.
    assert (answered.server, answered.version, answered.adapter_sha256) == (first.url, 2, SHA[2])
    assert (other.server, other.version, other.adapter_sha256) == (second.url, 1, SHA[1])
    assert client.version == 1  # what every server serves


async def test_a_failing_server_is_routed_around_and_backed_off(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    failing, healthy = fake_servers([1]), fake_servers([1])
    failing.status = 500
    async with InferenceClient(_pool_cfg(failing, healthy)) as client:
        results = [await asyncio.wait_for(client.act("prompt", CHOICES), 30) for _ in range(3)]
    assert [r.server for r in results] == [healthy.url] * 3
    assert failing.completions == 1  # backed off after its failure: not asked again
    assert (client.servers[0].failovers, client.servers[0].failures) == (1, 1)
    assert (client.servers[1].failovers, client.servers[1].requests) == (0, 3)


async def test_an_answer_the_server_aborted_goes_to_another_server(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    stopping, healthy = fake_servers([1]), fake_servers([1])
    stopping.finish_reason = "abort"
    async with InferenceClient(_pool_cfg(stopping, healthy)) as client:
        result = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
    # The truncated answer is never parsed as the policy's action: the healthy server's full one is.
    assert (result.server, result.text, result.finish_reason) == (healthy.url, CHOICES[0], "stop")
    assert stopping.completions == 1 and client.servers[0].failures == 1


async def test_consecutive_aborts_double_the_servers_backoff(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    stopping = fake_servers([1])
    stopping.finish_reason = "abort"
    cfg = _pool_cfg(stopping, retries=1, retry_backoff_s=0.01, server_backoff_s=10.0, server_backoff_max_s=100.0)
    async with InferenceClient(cfg) as client:
        with pytest.raises(InferenceUnavailableError, match="aborted the request"):
            await asyncio.wait_for(client.act("prompt", CHOICES), 30)
    server = client.servers[0]
    assert (server.failures, server.consecutive_failures) == (2, 2)
    assert server.retry_at - time.monotonic() > 15.0  # 10 s doubled, not 10 s again


async def test_an_answer_by_a_version_the_server_does_not_list_goes_to_another_server(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    confused, healthy = fake_servers([1]), fake_servers([1])
    confused.answers_as = "policy-v7"
    async with InferenceClient(_pool_cfg(confused, healthy)) as client:
        result = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
    assert (result.server, result.version, result.adapter_sha256) == (healthy.url, 1, SHA[1])
    assert confused.completions == 1 and client.servers[0].failures == 1


async def test_a_failed_server_is_tried_again_after_its_backoff(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    flaky, healthy = fake_servers([1]), fake_servers([1])
    flaky.status = 503
    async with InferenceClient(_pool_cfg(flaky, healthy, server_backoff_s=0.2)) as client:
        first = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
        assert first.server == healthy.url and client.servers[0].consecutive_failures == 1
        flaky.status = 200
        deadline = time.monotonic() + 30
        answered_by: set[str] = set()
        while flaky.url not in answered_by and time.monotonic() < deadline:
            # Once its backoff ends, the recovered server is preferred: as few in flight, fewer requests sent.
            answered_by.add((await asyncio.wait_for(client.act("prompt", CHOICES), 30)).server)
            await asyncio.sleep(0.05)
    assert flaky.url in answered_by, "the server that recovered was never tried again"
    assert client.servers[0].consecutive_failures == 0


async def test_a_request_fails_only_when_every_server_fails(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    down, broken = fake_servers([1]), fake_servers([1])
    broken.status = 500
    cfg = _pool_cfg(down, broken, retries=1, retry_backoff_s=0.01)
    async with InferenceClient(cfg) as client:
        await client.refresh_versions()
        down.stop()
        with pytest.raises(InferenceUnavailableError, match="every server after 2 attempts") as info:
            await asyncio.wait_for(client.act("prompt", CHOICES), 30)
    assert down.url in str(info.value) and broken.url in str(info.value) and "engine dead" in str(info.value)
    assert broken.completions == 2  # one attempt per round


async def test_an_answer_by_a_version_retired_meanwhile_still_records_the_adapter_the_server_listed(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    server = fake_servers([1])

    async def until(count: int) -> None:
        deadline = time.monotonic() + 30
        while server.completions < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async with InferenceClient(_pool_cfg(server, version_poll_s=0.01)) as client:
        server.hold_requests()
        first = asyncio.create_task(client.act("prompt", CHOICES))
        await until(1)
        server.versions = [2]  # v2 loaded and v1 retired while v1 was answering
        await asyncio.sleep(0.05)
        second = asyncio.create_task(client.act("prompt", CHOICES))  # re-reads the listing: v2 only
        await until(2)
        server.release_requests()
        answers = await asyncio.wait_for(asyncio.gather(first, second), 30)
    assert [(a.version, a.adapter_sha256) for a in answers] == [(1, SHA[1]), (2, SHA[2])]


def _image_prompt() -> ImagePrompt:
    png = b"\x89PNG\r\n\x1a\n a screenshot"
    messages = build_messages("Turn on Wi-Fi", "[0] switch Wi-Fi off", [], CHOICES, image=True)
    return ImagePrompt("<rendered by the chat template>", png, hashlib.sha256(png).hexdigest(), messages)


async def test_an_image_prompt_is_sent_to_the_chat_api_with_the_screenshot_as_a_data_url(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    server = fake_servers([1])
    prompt = _image_prompt()
    async with InferenceClient(_pool_cfg(server)) as client:
        result = await asyncio.wait_for(client.act(prompt, CHOICES), 30)
    [(path, body)] = server.posted
    assert path == "/v1/chat/completions" and "prompt" not in body
    system, user = body["messages"]
    assert system == prompt.messages[0]
    image, text = user["content"]
    assert image["type"] == "image_url"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.removeprefix("data:image/png;base64,")) == prompt.png
    assert text == prompt.messages[1]["content"][1] and "Task: Turn on Wi-Fi" in text["text"]
    assert prompt.messages[1]["content"][0] == IMAGE_PART  # the learner's copy keeps its placeholder
    assert {k: body[k] for k in ("logprobs", "top_logprobs", "temperature", "top_p", "top_k", "return_token_ids")} == {
        "logprobs": True,
        "top_logprobs": 0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "return_token_ids": True,
    }
    assert body["structured_outputs"] == {"choice": CHOICES}
    assert body["max_tokens"] == max(len(c.encode()) for c in CHOICES) + 1
    assert (result.text, result.token_ids, result.tokens, result.token_logprobs, result.logprob) == (
        CHOICES[0],
        (5, 6),
        ("a", "b"),
        (-0.5, -0.25),
        -0.75,
    )
    assert (result.prompt_token_ids, result.finish_reason, result.mode) == (tuple(PROMPT_IDS), "stop", "choice")
    assert (result.model, result.version, result.adapter_sha256) == ("policy-v1", 1, SHA[1])


async def test_a_text_prompt_is_still_sent_to_the_completions_api(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    server = fake_servers([1])
    async with InferenceClient(_pool_cfg(server)) as client:
        result = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
    [(path, body)] = server.posted
    assert path == "/v1/completions"
    assert (body["prompt"], body["logprobs"]) == ("prompt", 0)
    assert "messages" not in body and "top_logprobs" not in body
    assert (result.text, result.tokens, result.logprob, result.prompt_token_ids) == (
        CHOICES[0],
        ("a", "b"),
        -0.75,
        tuple(PROMPT_IDS),
    )


async def test_a_chat_answer_that_cannot_be_read_raises_and_errors_name_the_chat_endpoint(
    fake_servers: Callable[[Sequence[int]], FakePolicyServer],
) -> None:
    class CompletionShaped(JsonHandler):
        """Answers a chat request in the completions API's shape: no message, no log-probs content."""

        def do_POST(self) -> None:
            body = self.read_json()
            choice = {"text": CHOICES[0], "token_ids": [5], "logprobs": {"tokens": ["a"], "token_logprobs": [-0.5]}}
            self.send_json(200, {"model": body["model"], "choices": [choice]})

        def do_GET(self) -> None:
            self.send_json(200, {"object": "list", "data": [{"id": "policy-v0", "root": "/models/tiny"}]})

    with BackgroundHttpServer(CompletionShaped) as wrong:
        async with InferenceClient(InferenceConfig(url=wrong.url, retries=0)) as client:
            with pytest.raises(InferenceError, match=r"unexpected /v1/chat/completions response \(KeyError"):
                await asyncio.wait_for(client.act(_image_prompt(), CHOICES), 30)
    failing = fake_servers([1])
    failing.status = 500
    async with InferenceClient(_pool_cfg(failing)) as client:
        with pytest.raises(InferenceUnavailableError, match="POST /v1/chat/completions failed on every server"):
            await asyncio.wait_for(client.act(_image_prompt(), CHOICES), 30)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b"[1, 2]", "not a model list"),
        (b'{"data": ["policy-v0"]}', "not a model list"),
    ],
)
async def test_a_version_listing_that_cannot_be_read_is_a_failed_server_not_a_crash(answer: bytes, reason: str) -> None:
    """What a proxy or another API on the port answers: an InferenceError the collector rides out, never a
    ValueError or AttributeError that ends its slot."""

    class Garbled(JsonHandler):
        def do_GET(self) -> None:
            self.send_bytes(200, answer)

    with BackgroundHttpServer(Garbled) as garbled:
        async with InferenceClient(InferenceConfig(url=garbled.url, retries=0)) as client:
            with pytest.raises(InferenceUnavailableError, match=f"GET /v1/models failed on every server .*{reason}"):
                await asyncio.wait_for(client.refresh_versions(), 30)


async def test_credentials_in_a_server_url_go_as_basic_auth_and_are_masked_wherever_the_url_is_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a collector logs, labels its metrics with and records as each step's server (on the trajectory topic)."""
    expected = "Basic " + base64.b64encode(b"alice:s3cret").decode()

    class Guarded(JsonHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != expected:
                self.send_json(401, {"error": "who are you"})
                return
            self.send_json(200, {"object": "list", "data": [{"id": "policy-v0", "root": "/models/tiny"}]})

        def do_POST(self) -> None:
            body = self.read_json()
            if self.headers.get("Authorization") != expected:
                self.send_json(401, {"error": "who are you"})
                return
            logprobs = {"tokens": ["a"], "token_logprobs": [-0.5]}
            choice = {"text": CHOICES[0], "token_ids": [5], "logprobs": logprobs, "finish_reason": "stop"}
            self.send_json(200, {"model": body["model"], "choices": [choice]})

    caplog.set_level("DEBUG")
    with BackgroundHttpServer(Guarded) as guarded:
        url = guarded.url.replace("http://", "http://alice:s3cret@")
        async with InferenceClient(InferenceConfig(url=url, retries=0)) as client:
            result = await asyncio.wait_for(client.act("prompt", CHOICES), 30)
        masked = guarded.url.replace("http://", "http://alice:**********@")
        assert result.server == masked and client.urls == (masked,)
    assert "s3cret" not in caplog.text
