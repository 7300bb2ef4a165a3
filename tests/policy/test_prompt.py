"""The one prompt format shared by the collector and the learner."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from distrl_stream.collector import run_episode
from distrl_stream.config import LearnerConfig, ModelConfig
from distrl_stream.envs.sim import SimEnv, sim_corpus, sim_tasks
from distrl_stream.inference.client import ActionResult
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.records import episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from distrl_stream.orchestrate import PRETRAINED_UP_PROFILE
from distrl_stream.policy.prompt import (
    MAX_OBSERVATION_CHARS,
    MAX_PREVIOUS,
    SYSTEM_PROMPT,
    TRUNCATION_MARK,
    Prompter,
    TokenPrompt,
    build_prompt,
)
from distrl_stream.testing.scripted import ScriptedPolicy

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


class _Recording(ScriptedPolicy):
    """The scripted policy, keeping every prompt it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[str] = []
        self.candidates: list[list[str]] = []

    async def act(self, prompt: str, candidates: Sequence[str] | None = None, *, mode: str = "choice") -> ActionResult:
        self.prompts.append(prompt)
        self.candidates.append(list(candidates or ()))
        return await super().act(prompt, candidates, mode=mode)


def test_a_tokenizer_with_a_chat_template_gets_the_chat_format_and_the_tiny_one_the_raw(
    smollm2_dir: Path, tiny_model_dir: Path
) -> None:
    chat = Prompter(AutoTokenizer.from_pretrained(smollm2_dir))
    raw = Prompter(AutoTokenizer.from_pretrained(tiny_model_dir))
    assert (chat.format, raw.format, Prompter().format) == ("chat", "raw", "raw")
    text = chat("Turn on Wi-Fi", "[0] switch Wi-Fi off", ACTIONS[:1], ACTIONS[2:4])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nTask: Turn on Wi-Fi\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")  # the action is the assistant's answer
    assert (
        f"Previous actions:\n{ACTIONS[0]}\nChoose one of these actions:\n{ACTIONS[2]}\n{ACTIONS[3]}<|im_end|>" in text
    )
    assert raw("Turn on Wi-Fi", "[0] switch Wi-Fi off", ACTIONS[:1], ACTIONS[2:4]) == build_prompt(
        "Turn on Wi-Fi", "[0] switch Wi-Fi off", ACTIONS[:1]
    )


def test_the_chat_prompt_the_collector_sent_is_the_one_the_learner_rebuilds(smollm2_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    env = SimEnv()
    policy = _Recording(env, tokenizer, noise=0.5, rng=random.Random(1))
    tasks = sim_tasks("train", 20, ["add_contact_and_call", "turn_on_setting"])
    model, learner_tokenizer = load_policy(smollm2_dir, ModelConfig())
    trainer = Trainer(LearnerConfig(), model, learner_tokenizer, ReplayBuffer.from_config(LearnerConfig()))
    assert trainer.prompter.format == "chat"
    for i, task in enumerate(tasks[:6]):
        policy.prompts.clear()
        outcome = asyncio.run(
            run_episode(env, task, policy, "choice", episode_id=f"e{i}", prompter=Prompter(tokenizer))
        )
        record = episode_from_event(outcome.to_event(run="r", collector_id="c", mode="choice", base_model="smollm2"))
        assert len(record) == len(policy.prompts) > 0
        assert [trainer.rendered_prompt(record, t) for t in range(len(record))] == policy.prompts
        # What it trains on are the ids the policy was prompted with, which its own rendering reproduces.
        assert [trainer.step_prompt(record, t) for t in range(len(record))] == [
            TokenPrompt(tuple(tokenizer(p)["input_ids"])) for p in policy.prompts
        ]
        assert trainer.check_prompt_ids(record) == 0


def test_every_sim_chat_prompt_and_its_longest_action_fit_the_pretrained_profile_context(smollm2_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    env = SimEnv()
    policy = _Recording(env, tokenizer, noise=1.0, rng=random.Random(0))
    rng = random.Random(0)
    tasks = sim_tasks("train", 300) + sim_tasks("test", 300)
    for task in rng.sample(tasks, 80):
        asyncio.run(run_episode(env, task, policy, "choice", episode_id="e", prompter=Prompter(tokenizer)))
    lengths = [
        len(tokenizer(p)["input_ids"]) + max(len(tokenizer(c)["input_ids"]) for c in cands) + 1
        for p, cands in zip(policy.prompts, policy.candidates, strict=True)
    ]
    limit = PRETRAINED_UP_PROFILE["inference"]["max_model_len"]
    assert max(lengths) <= limit, (max(lengths), limit)
