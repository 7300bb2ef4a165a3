"""A vision-language policy served by vLLM: a step's screenshot and chat prompt through the chat API, tokenised as the
learner's processor tokenises them, and a LoRA version on the language tower hot-loaded and changing the answers."""

from __future__ import annotations

import asyncio
import io
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import ProcessorMixin

from distrl_stream.artifacts import atomic_dir, version_event
from distrl_stream.config import ModelConfig
from distrl_stream.errors import LearnerError
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.inference.versions import AdapterLoader
from distrl_stream.learner.trainer import load_policy
from distrl_stream.policy.logprobs import action_logprobs, encode_prompts
from distrl_stream.policy.prompt import ImagePrompt, Prompter, TokenPrompt
from distrl_stream.policy.vision import IMAGE_TOKEN, load_processor
from tests.fixtures.vllm import VllmService

pytestmark = pytest.mark.vllm

SCREEN = "Settings\n[0] switch Wi-Fi off\n[1] switch Bluetooth on"
CANDIDATES = [
    '{"action_type":"click","index":0}',
    '{"action_type":"click","index":1}',
    '{"action_type":"navigate_back"}',
]
SAMPLES = 16  # answers per prompt and version
# Served in float32: the same prompt and version give the same log-prob to within this (batches sum in other orders).
TOLERANCE = 1e-4
# Learner log π against the served log μ, both float32 (whole answers: sums of up to ~30 token log-probs).
PARITY = 1e-3


def _screenshot(background: str, rows: str) -> bytes:
    """A phone-shaped PNG with the screen's rows as filled bars."""
    image = Image.new("RGB", (224, 448), background)
    draw = ImageDraw.Draw(image)
    for i in range(6):
        draw.rectangle((10, 20 + 70 * i, 214, 70 + 70 * i), fill=rows)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def processor(tiny_vl_server: VllmService) -> ProcessorMixin:
    return load_processor(tiny_vl_server.model_dir)


@pytest.fixture(scope="module")
def prompts(processor: ProcessorMixin) -> list[ImagePrompt]:
    """The same step on a light and on a dark screenshot."""
    prompter = Prompter(processor, vision=True)
    screenshots = [_screenshot("white", "black"), _screenshot("navy", "orange")]
    return [prompter("Turn on Wi-Fi", SCREEN, [], CANDIDATES, screenshot=png) for png in screenshots]  # type: ignore[misc]


def _act(service: VllmService, prompts: Sequence[ImagePrompt]) -> list[list[ActionResult]]:
    """``SAMPLES`` choice-mode answers to each prompt, concurrently, from the newest version served."""

    async def act() -> list[ActionResult]:
        async with InferenceClient(service.inference, service.policy_id) as client:
            await client.refresh_versions()
            return await asyncio.gather(
                *(client.act(p, CANDIDATES, mode="choice") for p in prompts for _ in range(SAMPLES))
            )

    results = asyncio.run(act())
    return [results[i : i + SAMPLES] for i in range(0, len(results), SAMPLES)]


def _first_token_logprobs(results: Sequence[ActionResult]) -> dict[int, float]:
    """log μ of each first token sampled. Choice mode allows the same first tokens on every request (the candidates'
    prefixes), so a first token's log-prob depends on the model and the prompt alone; later ones also depend on how
    the answer was spelled so far."""
    by_token: dict[int, list[float]] = defaultdict(list)
    for result in results:
        by_token[result.token_ids[0]].append(result.token_logprobs[0])
    for values in by_token.values():
        assert max(values) - min(values) < TOLERANCE, values
    return {token: values[0] for token, values in by_token.items()}


def _assert_parity(
    model: torch.nn.Module,
    processor: ProcessorMixin,
    prompt: ImagePrompt | TokenPrompt,
    results: Sequence[ActionResult],
) -> None:
    """The learner's log π(a | image, text) of every served answer is the server's log μ."""
    with torch.no_grad():
        ours = action_logprobs(
            model, processor, [prompt] * len(results), [r.token_ids for r in results], [CANDIDATES] * len(results)
        )
    gaps = (ours.logprob - torch.tensor([r.logprob for r in results])).abs()
    assert float(gaps.max()) < PARITY, gaps.tolist()


def _assert_differ(a: Sequence[ActionResult], b: Sequence[ActionResult]) -> None:
    """The first tokens sampled in both ``a`` and ``b`` got clearly different log-probs."""
    first_a, first_b = _first_token_logprobs(a), _first_token_logprobs(b)
    common = first_a.keys() & first_b.keys()
    assert common, (first_a, first_b)
    assert all(abs(first_a[t] - first_b[t]) > 100 * TOLERANCE for t in common), (first_a, first_b)


def test_a_screenshot_prompt_is_answered_through_the_chat_api_as_the_learner_tokenises_it(
    tiny_vl_server: VllmService, processor: ProcessorMixin, prompts: list[ImagePrompt]
) -> None:
    light, dark = _act(tiny_vl_server, prompts)
    assert all(r.text in CANDIDATES and (r.version, r.finish_reason) == (0, "stop") for r in light + dark)
    model, _processor = load_policy(tiny_vl_server.model_dir, ModelConfig(), vision=True)  # a fresh adapter: the base
    for prompt, results in zip(prompts, (light, dark), strict=True):
        # The server rendered the messages and expanded the image as the learner encodes them, and scored the answers
        # as the learner does.
        [expected] = encode_prompts(processor, [prompt]).input_ids
        assert all(list(r.prompt_token_ids) == expected for r in results)
        _assert_parity(model, processor, prompt, results)
        # The learner trains on the server's ids, its screenshot's pixels placed at their image tokens.
        served = TokenPrompt(results[0].prompt_token_ids, prompt)
        ours, rendered = encode_prompts(processor, [served]), encode_prompts(processor, [prompt])
        assert ours.input_ids == rendered.input_ids
        assert ours.images.keys() == rendered.images.keys()
        assert all(torch.equal(ours.images[k], rendered.images[k]) for k in ours.images)
        _assert_parity(model, processor, served, results)
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids = list(light[0].prompt_token_ids)
    start = ids.index(image_id)
    assert ids[start : start + processor.image_seq_len] == [image_id] * processor.image_seq_len
    assert ids.count(image_id) == processor.image_seq_len == 16
    _assert_differ(light, dark)  # the image reaches the model
    # Ids whose image tokens the screenshot cannot fill are refused, never trained on misplaced pixels.
    short = tuple(i for k, i in enumerate(ids) if not (i == image_id and k == start))
    with pytest.raises(LearnerError, match="hold 15 image tokens, its screenshot fills 16"):
        encode_prompts(processor, [TokenPrompt(short, prompts[0])])


def test_a_lora_version_on_the_language_tower_is_hot_loaded_and_changes_the_answers(
    tiny_vl_server: VllmService, processor: ProcessorMixin, prompts: list[ImagePrompt], tmp_path: Path
) -> None:
    base = _act(tiny_vl_server, prompts)
    torch.manual_seed(0)
    # The learner's own policy: its LoRA targets on a vision model (the language tower only).
    model, _processor = load_policy(tiny_vl_server.model_dir, ModelConfig(), vision=True)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # peft's B = 0 would leave the answers as the base model's
            torch.nn.init.normal_(parameter, std=0.05)
    with atomic_dir(tmp_path / "adapter") as folder:
        model.save_pretrained(folder)
    event = version_event(
        ModelConfig(),
        1,
        tmp_path / "adapter",
        adapter_uri=str(tmp_path / "adapter"),
        base_fingerprint="",
        learner_step=1,
        trajectories_consumed=0,
    )
    loader = AdapterLoader(tiny_vl_server.url, tiny_vl_server.policy_id, 1, tmp_path / "staging")
    try:
        loader.load(event)
        tuned = _act(tiny_vl_server, prompts)
    finally:
        tiny_vl_server.unload_all_adapters()
    assert {(r.model, r.adapter_sha256) for answers in tuned for r in answers} == {("policy-v1", event.sha256)}
    assert all(r.text in CANDIDATES for answers in tuned for r in answers)
    for before, after in zip(base, tuned, strict=True):
        _assert_differ(before, after)
    # The served version is the learner's: the same log-probs on its answers.
    for prompt, answers in zip(prompts, tuned, strict=True):
        _assert_parity(model, processor, prompt, answers)
