"""Vision-language policies: the local tiny Idefics3 model, its prompts, and log π(a | image, text) as the model
computes it (no services)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch

from distrl_stream.config import ModelConfig, load_config
from distrl_stream.errors import ConfigError, ModelBuildError
from distrl_stream.learner.critics import prompt_features
from distrl_stream.learner.trainer import load_policy, lora_target_modules
from distrl_stream.policy.logprobs import (
    action_logprobs,
    encode_prompts,
    text_tokenizer,
    use_shared_prefix_attention,
)
from distrl_stream.policy.model import build_model, load_base_model
from distrl_stream.policy.model_dir import load_prompter, reads_screenshots
from distrl_stream.policy.prompt import IMAGE_PART, ImagePrompt, Prompter
from distrl_stream.policy.vision import IMAGE_TOKEN, VISION_SPECS, decode_png, is_vision_model, load_processor
from distrl_stream.testing.samples import png

torch.set_num_threads(1)
CANDIDATES = ['{"action_type":"click","index":0}', '{"action_type":"navigate_home"}']


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("models") / "tiny-vl", "tiny-vl", seed=0)


def image_prompt(vl_dir: Path, colour: tuple[int, int, int]) -> ImagePrompt:
    prompt = Prompter(load_processor(vl_dir), vision=True)(
        "Turn on wifi", "[0] toggle Wi-Fi off", [], CANDIDATES, screenshot=png((160, 200), colour)
    )
    assert isinstance(prompt, ImagePrompt)
    return prompt


def test_the_tiny_vision_model_is_built_deterministically_and_recognised(vl_dir: Path, tmp_path: Path) -> None:
    again = build_model(tmp_path / "again", "tiny-vl", seed=0)
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (vl_dir, again)]
    assert digest[0] == digest[1]
    assert is_vision_model(vl_dir)
    assert not is_vision_model(build_model(tmp_path / "text", "tiny"))
    assert not is_vision_model(tmp_path / "missing")


def test_a_vision_prompt_puts_the_screenshot_first_and_the_processor_expands_it(vl_dir: Path) -> None:
    prompt = image_prompt(vl_dir, (200, 30, 30))
    user = prompt.messages[1]["content"]
    assert user[0] == IMAGE_PART and user[1]["type"] == "text" and "Turn on wifi" in user[1]["text"]
    assert prompt.text.count(IMAGE_TOKEN) == 1
    assert prompt.image_sha256 == hashlib.sha256(prompt.png).hexdigest()
    processor = load_processor(vl_dir)
    ids = encode_prompts(processor, [prompt]).input_ids[0]
    image_id = text_tokenizer(processor).convert_tokens_to_ids(IMAGE_TOKEN)
    assert ids.count(image_id) == VISION_SPECS["tiny-vl"].image_seq_len
    # Equal by text and image: the same screen in the same state is one critic feature.
    assert prompt == image_prompt(vl_dir, (200, 30, 30)) != image_prompt(vl_dir, (30, 30, 200))


def test_a_vision_policy_step_without_a_screenshot_is_refused(vl_dir: Path) -> None:
    prompter = Prompter(load_processor(vl_dir), vision=True)
    with pytest.raises(ValueError, match="screenshot"):
        prompter("Turn on wifi", "[0] toggle Wi-Fi off", [], CANDIDATES)
    with pytest.raises(ModelBuildError, match="chat template"):
        Prompter(None, vision=True)


def test_log_pi_of_an_image_prompt_is_the_models_own_forward_and_depends_on_the_image(vl_dir: Path) -> None:
    model, processor = load_policy(vl_dir, ModelConfig(), vision=True)
    model.eval()
    red, blue = image_prompt(vl_dir, (200, 30, 30)), image_prompt(vl_dir, (30, 30, 200))
    tokenizer = text_tokenizer(processor)
    action = [*tokenizer(CANDIDATES[1])["input_ids"], tokenizer.eos_token_id]
    with torch.no_grad():
        ours = action_logprobs(model, processor, [red, blue], [action, action])
        # The reference: the whole model on prompt + action, with its pixels, log-softmax at the action positions.
        reference = []
        for prompt in (red, blue):
            encoded = processor(text=prompt.text, images=[decode_png(prompt.png)], return_tensors="pt")
            ids = torch.cat([encoded["input_ids"], torch.tensor([action])], dim=1)
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=encoded["pixel_values"],
                pixel_attention_mask=encoded["pixel_attention_mask"],
            ).logits[0]
            width = encoded["input_ids"].shape[1]
            logp = torch.log_softmax(logits[width - 1 : width - 1 + len(action)].float(), dim=-1)
            reference.append(logp.gather(-1, torch.tensor(action).unsqueeze(-1)).sum().item())
    assert ours.logprob.tolist() == pytest.approx(reference, abs=1e-4)
    assert abs(reference[0] - reference[1]) > 1e-4  # the image reaches the policy


def test_image_prompts_are_never_packed(vl_dir: Path) -> None:
    # Packing moves tokens, and the model places an image's features by token position: the unpacked pass.
    model, processor = load_policy(vl_dir, ModelConfig(), vision=True)
    model.eval()
    assert use_shared_prefix_attention(model) == "the policy is a vision-language model"
    red, blue = image_prompt(vl_dir, (200, 30, 30)), image_prompt(vl_dir, (30, 30, 200))
    tokenizer = text_tokenizer(processor)
    action = [*tokenizer(CANDIDATES[1])["input_ids"], tokenizer.eos_token_id]
    with torch.no_grad():
        asked = action_logprobs(model, processor, [red, blue], [action, action], shared_prefix_tokens=1)
        unpacked = action_logprobs(model, processor, [red, blue], [action, action])
    assert torch.equal(asked.token_logprobs, unpacked.token_logprobs)


def test_lora_trains_the_language_tower_only(vl_dir: Path) -> None:
    base = load_base_model(vl_dir)
    target = lora_target_modules(ModelConfig(), base)
    assert isinstance(target, str)
    matched = [name for name, _ in base.named_modules() if re.fullmatch(target, name)]
    assert matched and all(name.startswith("model.text_model.layers.") for name in matched)
    assert {name.rsplit(".", 1)[-1] for name in matched} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    model, _ = load_policy(vl_dir, ModelConfig(), vision=True)
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".text_model." in name and "lora_" in name for name in trained)


def test_critic_features_of_an_image_prompt_include_the_image(vl_dir: Path) -> None:
    model, processor = load_policy(vl_dir, ModelConfig(), vision=True)
    red, blue = image_prompt(vl_dir, (200, 30, 30)), image_prompt(vl_dir, (30, 30, 200))
    # A text prompt may share the batch (the image prompts' pixels fill their own image tokens only).
    features = prompt_features(model, processor, [red, blue, "Task: Turn on wifi"])
    assert features.shape == (3, VISION_SPECS["tiny-vl"].hidden_size)
    assert not torch.allclose(features[0], features[1])
    # Batched or alone, a prompt's feature is the same.
    assert torch.allclose(features[0], prompt_features(model, processor, [red])[0], atol=1e-5)


def test_a_screen_that_spells_the_image_token_does_not_ask_for_a_second_image(vl_dir: Path) -> None:
    prompter = Prompter(load_processor(vl_dir), vision=True)
    prompt = prompter(
        "Find <image>", "[0] text <image> here", ["<image>"], CANDIDATES, screenshot=png((9, 9), (1, 2, 3))
    )
    assert isinstance(prompt, ImagePrompt) and prompt.text.count(IMAGE_TOKEN) == 1
    encoded = encode_prompts(load_processor(vl_dir), [prompt])  # one image's tokens, one image
    assert encoded.images["pixel_values"].shape[0] == 1


def test_named_lora_targets_of_a_vision_model_stay_in_the_language_tower(vl_dir: Path) -> None:
    base = load_base_model(vl_dir)
    target = lora_target_modules(ModelConfig(lora_target_modules=["q_proj", "v_proj"]), base)
    assert isinstance(target, str)
    matched = [name for name, _ in base.named_modules() if re.fullmatch(target, name)]
    assert len(matched) == 4 and all(name.startswith("model.text_model.layers.") for name in matched)


def test_a_folder_without_an_image_processor_is_not_a_vision_policy(vl_dir: Path, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(vl_dir, bare)
    (bare / "processor_config.json").unlink()
    with pytest.raises(ModelBuildError, match="no processor for a vision model"):
        load_processor(bare)


def test_model_modality_is_one_decision_for_the_collector_and_the_learner(vl_dir: Path, tmp_path: Path) -> None:
    auto = load_config(None, data_dir=tmp_path, model={"base": vl_dir})
    assert reads_screenshots(auto) and load_prompter(auto).vision
    # A vision-language model asked to read text: chat prompts without the image, and a learner with the tokenizer.
    text = load_config(None, data_dir=tmp_path, model={"base": vl_dir, "modality": "text"})
    prompter = load_prompter(text)
    assert not reads_screenshots(text) and not prompter.vision and prompter.format == "chat"
    _model, encoder = load_policy(vl_dir, ModelConfig(), vision=reads_screenshots(text))
    assert encoder is text_tokenizer(encoder)
    # Vision asked of a text model: one line naming the field, before anything is built.
    local_text = load_config(None, data_dir=tmp_path, model={"modality": "vision"})
    with pytest.raises(ConfigError, match=r"^model\.modality: vision, but model\.size 'tiny' is a text model$"):
        load_prompter(local_text)
    assert not (tmp_path / "models").exists()
    text_base = load_config(
        None, data_dir=tmp_path, model={"base": build_model(tmp_path / "t", "tiny"), "modality": "vision"}
    )
    with pytest.raises(ConfigError, match="has no vision tower"):
        reads_screenshots(text_base)
