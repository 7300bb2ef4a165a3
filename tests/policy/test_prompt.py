"""The one prompt format shared by the collector and the learner."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from distrl_stream.envs.sim import sim_corpus, sim_tasks
from distrl_stream.policy.prompt import MAX_OBSERVATION_CHARS, MAX_PREVIOUS, TRUNCATION_MARK, build_prompt

ACTIONS = [f'{{"action_type":"click","index":{i}}}' for i in range(6)]


def test_prompt_is_a_pure_function_of_its_inputs() -> None:
    first = build_prompt("Turn on Wi-Fi", "[0] switch Wi-Fi off\n[1] button Back", ACTIONS[:2])
    assert first == build_prompt("Turn on Wi-Fi", "[0] switch Wi-Fi off\n[1] button Back", tuple(ACTIONS[:2]))
    assert first == (
        "Task: Turn on Wi-Fi\nScreen:\n[0] switch Wi-Fi off\n[1] button Back\nPrevious:\n"
        '{"action_type":"click","index":0}\n{"action_type":"click","index":1}\nAction:\n'
    )


def test_prompt_shows_only_the_most_recent_actions() -> None:
    prompt = build_prompt("task", "screen", ACTIONS, max_previous=3)
    assert [a for a in ACTIONS if a in prompt] == ACTIONS[-3:]
    assert "Previous:\nnone\n" in build_prompt("task", "screen", [])


def test_instruction_and_actions_stay_on_one_line_each() -> None:
    prompt = build_prompt("do it\nnow", "screen", ['{"a":1}\n{"b":2}', "x"])
    lines = prompt.splitlines()
    assert lines[0] == "Task: do it now"
    assert lines[lines.index("Previous:") + 1 : -1] == ['{"a":1} {"b":2}', "x"]
    assert prompt.endswith("Action:\n")


def test_long_observation_is_cut_and_marked() -> None:
    prompt = build_prompt("task", "x" * 10_000, [])
    screen = prompt.split("Screen:\n", 1)[1].split("\nPrevious:", 1)[0]
    assert len(screen) == MAX_OBSERVATION_CHARS
    assert screen.endswith(TRUNCATION_MARK)


def test_a_prompt_at_every_cap_plus_the_longest_action_fits_the_tiny_model_context(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = list(sim_corpus(100))
    # A screen as long as the cap allows, made of real screen lines (each distinct: no cheap repetition).
    lines = sorted({line for text in texts if text.startswith("Task:") for line in text.splitlines()[2:]})
    screen = "\n".join(lines)
    assert len(screen) > MAX_OBSERVATION_CHARS
    actions = sorted({t for t in texts if t.startswith('{"action_type"')}, key=len)
    instruction = max((t.instruction for t in sim_tasks("train", 300) + sim_tasks("test", 300)), key=len)
    prompt = build_prompt(instruction, screen, actions[-MAX_PREVIOUS:])
    n_tokens = len(tokenizer(prompt)["input_ids"]) + len(tokenizer(actions[-1])["input_ids"]) + 1  # + stop token
    assert n_tokens <= 512, n_tokens
