"""The prompt formats of the policy, and the one function that picks between them (:class:`Prompter`).

The collector sends the prompt's text to the inference server and the learner recomputes log π(a|s) on the very
same text, so :class:`Prompter` is the contract between them: a pure function of the step (no clock, no randomness,
no global state) and of the tokenizer, versioned by :data:`PROMPT_VERSION`. Two formats:

- **chat**, for a tokenizer with a chat template (a pretrained instruct model): :func:`build_messages` (a system
  message with the action format, a user message with the task, screen, previous actions and, in choice mode, the
  actions to choose from) rendered by the tokenizer's own template with the generation prompt, so the action is the
  assistant's answer and the model's instruction tuning is used;
- **raw**, for the local tiny models (their tokenizers have no template): :func:`build_prompt`'s plain fields. The
  action is generated right after the trailing newline.

A **vision** policy (``Prompter(tokenizer, vision=True)``) uses the chat format with the step's screenshot as the
first part of the user's message, and its prompt is an :class:`ImagePrompt`: the messages (the collector sends them
through vLLM's chat API, which applies the model's chat template) and that same template's text with the image
placeholder (the learner's processor expands it as the server did), with the PNG bytes (docs/design.md §6.1).

Size: the tiny model serves at most 512 tokens (prompt + action), so the observation is cut to
``max_observation_chars`` (the end is marked), the instruction and each previous action are cut too, and only the
last ``max_previous`` actions are shown.

Environments give the observation as ``Observation.screen`` (the screen title, then one line per element) and the
instruction as ``Observation.instruction``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from distrl_stream.errors import ModelBuildError

if TYPE_CHECKING:  # the raw format (collectors of the tiny models) never imports transformers
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

# Bump when a format changes: a policy trained on one format is not comparable with another.
# 2: the chat format for tokenizers with a chat template (the raw format is unchanged).
PROMPT_VERSION = 2

PromptFormat = Literal["chat", "raw"]

# The image part of a user message: the chat template renders it as the model's image placeholder; the inference
# client replaces it by the screenshot as a data URL. Compared by value; each message gets a copy.
IMAGE_PART: dict[str, str] = {"type": "image"}

# What a pretrained model needs to be told that the tiny ones learn from reward alone: what the screen's lines are
# and what an action looks like. Kept short: every token of it is paid at every step.
SYSTEM_PROMPT = (
    "You operate a device's user interface to complete the user's task. The screen is listed one element per line "
    "as [index] kind label. Answer with exactly one action, a JSON object such as "
    '{"action_type":"click","index":3}; when a list of actions is given, answer with one of them, copied exactly.'
)

# Sized so that a prompt at every cap, in the simulator's vocabulary, plus the longest candidate action, fits the
# tiny model's 512 tokens (≈2.8 characters per token; see tests/policy/test_prompt.py). Text the tokenizer never saw
# costs more tokens per character: serve such environments with a real model and a larger max_model_len.
MAX_OBSERVATION_CHARS = 900
MAX_INSTRUCTION_CHARS = 200
MAX_PREVIOUS = 3
MAX_ACTION_CHARS = 80
TRUNCATION_MARK = "…"


def build_prompt(
    instruction: str,
    observation_text: str,
    previous_actions: Sequence[str] = (),
    *,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
    max_previous: int = MAX_PREVIOUS,
) -> str:
    """Render the policy's input for one step.

    Args:
        instruction: the task, in natural language.
        observation_text: the rendered screen (UI elements, one per line).
        previous_actions: the episode's actions so far, oldest first (action strings as the policy wrote them).
        max_observation_chars: the observation is cut to this many characters.
        max_previous: how many of the most recent previous actions are shown.

    Returns:
        The prompt; it ends with ``"Action:\\n"``, after which the policy writes one action.

    Example:
        >>> build_prompt("Turn on wifi", "[0] switch Wi-Fi off", ['{"action_type":"navigate_home"}'])
        'Task: Turn on wifi\\nScreen:\\n[0] switch Wi-Fi off\\nPrevious:\\n{"action_type":"navigate_home"}\\nAction:\\n'
    """
    task, screen, history = _fields(
        instruction, observation_text, previous_actions, max_observation_chars, max_previous
    )
    return f"Task: {task}\nScreen:\n{screen}\nPrevious:\n{history}\nAction:\n"


def build_messages(
    instruction: str,
    observation_text: str,
    previous_actions: Sequence[str] = (),
    candidates: Sequence[str] = (),
    *,
    image: bool = False,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
    max_previous: int = MAX_PREVIOUS,
) -> list[dict[str, Any]]:
    """The chat format's messages for one step: the system message, then the user's (task, screen, previous
    actions, and the candidates when there are any). Fields are cut as in :func:`build_prompt`. With ``image`` the
    user's content is a list: :data:`IMAGE_PART` (the screenshot), then the text.

    Example:
        >>> messages = build_messages("Turn on wifi", "[0] switch Wi-Fi off", [], ['{"action_type":"click","index":0}'])
        >>> print(messages[1]["content"])
        Task: Turn on wifi
        Screen:
        [0] switch Wi-Fi off
        Previous actions:
        none
        Choose one of these actions:
        {"action_type":"click","index":0}
    """
    task, screen, history = _fields(
        instruction, observation_text, previous_actions, max_observation_chars, max_previous
    )
    user = f"Task: {task}\nScreen:\n{screen}\nPrevious actions:\n{history}"
    if candidates:
        # Listed whole: the server's grammar allows exactly these strings, so the model should see every one.
        user += "\nChoose one of these actions:\n" + "\n".join(_one_line(c) for c in candidates)
    content: str | list[dict[str, str]] = [dict(IMAGE_PART), {"type": "text", "text": user}] if image else user
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]


@dataclass(frozen=True)
class ImagePrompt:
    """A vision policy's prompt for one step. Equal (and hashed) by its text and the image's digest.

    Attributes:
        text: the messages rendered by the model's chat template, the image as its placeholder (what the learner's
            processor encodes with the image).
        png: the screenshot.
        image_sha256: hex sha256 of ``png`` (the step's ``screenshot_sha256``).
        messages: the chat messages (:func:`build_messages` with ``image=True``), what the server is sent.
    """

    text: str
    png: bytes = field(repr=False, compare=False)
    image_sha256: str
    messages: list[dict[str, Any]] = field(repr=False, compare=False)


Prompt = str | ImagePrompt


@dataclass(frozen=True)
class TokenPrompt:
    """A step's prompt as the server tokenised it (``Step.prompt_token_ids``): what the learner computes log π on,
    so that what it trains on is exactly what the policy read, whatever its own template or tokenizer would render.

    Attributes:
        ids: the prompt's token ids, image placeholders expanded as the server expanded them.
        image: a vision step's prompt, re-rendered: its screenshot gives the pixels that fill the image tokens of
            ``ids``; None for a text prompt.
    """

    ids: tuple[int, ...]
    image: ImagePrompt | None = None


# What the learner's forward passes take: a prompt to encode, or one already encoded by the server.
ModelPrompt = Prompt | TokenPrompt


def prompt_image(prompt: ModelPrompt) -> ImagePrompt | None:
    """The image prompt behind ``prompt`` (a vision step's), or None for a text prompt."""
    return prompt.image if isinstance(prompt, TokenPrompt) else prompt if isinstance(prompt, ImagePrompt) else None


class Prompter:
    """Renders the prompt of a step in the format its tokenizer calls for: ``chat`` when the tokenizer has a chat
    template, else ``raw``. The collector and the learner each build one from the same base model, so they render
    the same text.

    Args:
        tokenizer: the policy's tokenizer (for a vision model, its processor, which renders the same template);
            None renders the raw format (a local tiny model, whose tokenizer has no template, without loading it).
        vision: the policy reads the screenshot (:func:`distrl_stream.policy.vision.is_vision_model`).

    Raises:
        ModelBuildError: ``vision`` without a chat template to put the image in.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase | ProcessorMixin | None = None, *, vision: bool = False
    ) -> None:
        self._tokenizer = tokenizer if tokenizer is not None and tokenizer.chat_template else None
        if vision and self._tokenizer is None:
            raise ModelBuildError("a vision policy needs a chat template (its processor's) to place the image in")
        self.vision = vision
        # A screen whose text spells the image placeholder would ask for a second image: it is shown spaced out.
        self._image_token: str | None = getattr(tokenizer, "image_token", None) if vision else None
        self.format: PromptFormat = "chat" if self._tokenizer is not None else "raw"

    def __call__(
        self,
        instruction: str,
        observation_text: str,
        previous_actions: Sequence[str] = (),
        candidates: Sequence[str] = (),
        *,
        screenshot: bytes | None = None,
    ) -> Prompt:
        """The prompt; the policy's action follows it directly. A vision policy's is an :class:`ImagePrompt` of
        ``screenshot``.

        Raises:
            ValueError: a vision policy's step without a screenshot.
        """
        if self._tokenizer is None:
            return build_prompt(instruction, observation_text, previous_actions)
        if self._image_token:
            token, spaced = self._image_token, f"{self._image_token[0]} {self._image_token[1:]}"
            instruction, observation_text = instruction.replace(token, spaced), observation_text.replace(token, spaced)
            previous_actions = [a.replace(token, spaced) for a in previous_actions]
        messages = build_messages(instruction, observation_text, previous_actions, candidates, image=self.vision)
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(text, str)
        if not self.vision:
            return text
        if screenshot is None:
            raise ValueError("a vision policy's step needs its screenshot (env.screenshots)")
        return ImagePrompt(text, screenshot, hashlib.sha256(screenshot).hexdigest(), messages)


def _fields(
    instruction: str,
    observation_text: str,
    previous_actions: Sequence[str],
    max_observation_chars: int,
    max_previous: int,
) -> tuple[str, str, str]:
    """The task, the screen and the history (the last ``max_previous`` actions, ``none`` without any), cut to size."""
    recent = list(previous_actions)[-max_previous:] if max_previous > 0 else []
    history = "\n".join(_clip(_one_line(a), MAX_ACTION_CHARS) for a in recent) if recent else "none"
    task = _clip(_one_line(instruction), MAX_INSTRUCTION_CHARS)
    return task, _clip(observation_text.strip(), max_observation_chars), history


def _one_line(text: str) -> str:
    # Newlines separate the prompt's fields; inside a field they would make it ambiguous.
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
