"""The one prompt format of the policy.

The collector sends :func:`build_prompt`'s text to the inference server and the learner recomputes log π(a|s) on
the very same text, so this function is the contract between them: a pure function of its arguments (no clock, no
randomness, no global state), versioned by :data:`PROMPT_VERSION`. The action is generated right after the
trailing newline.

Size: the tiny model serves at most 512 tokens (prompt + action), so the observation is cut to
``max_observation_chars`` (the end is marked), the instruction and each previous action are cut too, and only the
last ``max_previous`` actions are shown.

Environments give the observation as ``Observation.screen`` (the screen title, then one line per element) and the
instruction as ``Observation.instruction``.
"""

from __future__ import annotations

from collections.abc import Sequence

# Bump when the format changes: a policy trained on one format is not comparable with another.
PROMPT_VERSION = 1

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
    recent = list(previous_actions)[-max_previous:] if max_previous > 0 else []
    history = "\n".join(_clip(_one_line(a), MAX_ACTION_CHARS) for a in recent) if recent else "none"
    return (
        f"Task: {_clip(_one_line(instruction), MAX_INSTRUCTION_CHARS)}\n"
        f"Screen:\n{_clip(observation_text.strip(), max_observation_chars)}\n"
        f"Previous:\n{history}\n"
        "Action:\n"
    )


def _one_line(text: str) -> str:
    # Newlines separate the prompt's fields; inside a field they would make it ambiguous.
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
