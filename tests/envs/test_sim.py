"""The simulated phone: every template solvable by its oracle, hard for random play, deterministic, and strict."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque

import pytest

from distrl_stream.envs.actions import InvalidAction, parse_action
from distrl_stream.envs.base import Task
from distrl_stream.envs.sim import TEMPLATES, LatencyModel, SimEnv, candidate_actions, observe, sim_corpus, sim_tasks
from distrl_stream.envs.sim.oracle import next_action as next_oracle_action
from distrl_stream.envs.sim.templates import (
    FIELD_PARAM,
    FIELD_VOCAB,
    HORIZON_SLACK,
    field_texts,
    instantiate,
    make_task,
)
from distrl_stream.errors import EnvError, EpisodeStateError

TRAIN_PER_TEMPLATE = 15
TEST_PER_TEMPLATE = 5


def tasks_of(template: str) -> list[Task]:
    return [make_task(template, i, "train") for i in range(TRAIN_PER_TEMPLATE)] + [
        make_task(template, i, "test") for i in range(TEST_PER_TEMPLATE)
    ]


async def run_oracle(env: SimEnv, task: Task) -> list[float]:
    obs = await env.reset(task)
    rewards = []
    while True:
        action = env.oracle_action()
        assert action is not None, f"{task.id}: oracle gave up before success"
        assert action.to_text() in env.candidates(obs), f"{task.id}: oracle left the candidate set"
        result = await env.step(action.to_text())
        assert result.info.valid, result.info.reason
        rewards.append(result.reward)
        obs = result.observation
        if result.done or result.truncated:
            return rewards


def test_there_are_at_least_20_templates_including_multi_step_ones() -> None:
    assert len(TEMPLATES) >= 20
    lengths = {name: max(t.horizon - HORIZON_SLACK for t in tasks_of(name)[:5]) for name in TEMPLATES}
    assert sum(length >= 5 for length in lengths.values()) >= 4, lengths
    assert max(lengths.values()) >= 7


@pytest.mark.parametrize("template", sorted(TEMPLATES))
async def test_oracle_solves_every_seeded_instance_within_its_horizon(template: str) -> None:
    env = SimEnv()
    for task in tasks_of(template):
        rewards = await run_oracle(env, task)
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0, f"{task.id}: {rewards}"
        assert len(rewards) <= task.horizon <= 15
        assert env.is_success()


async def test_random_play_mostly_fails() -> None:
    rng = random.Random(7)
    env = SimEnv()
    wins: Counter[str] = Counter()
    episodes = 8
    for template in TEMPLATES:
        for task in tasks_of(template)[:episodes]:
            obs = await env.reset(task)
            while True:
                result = await env.step(rng.choice(env.candidates(obs)))
                obs = result.observation
                if result.done or result.truncated:
                    break
            wins[template] += result.info.success
    rate = sum(wins.values()) / (episodes * len(TEMPLATES))
    assert rate < 0.1, wins
    assert all(count <= episodes // 2 for count in wins.values()), wins


async def test_same_seed_gives_the_same_task_and_the_same_transitions() -> None:
    assert sim_tasks("train", 60) == sim_tasks("train", 60)
    for task in sim_tasks("train", 28, start=100):
        traces = []
        for _ in range(2):
            env, rng = SimEnv(), random.Random(task.seed)
            obs = await env.reset(task)
            trace = [obs.text]
            for _ in range(task.horizon):
                result = await env.step(rng.choice(env.candidates(obs)))
                obs = result.observation
                trace.append((obs.text, result.reward, result.done, result.truncated, result.info.valid))
                if result.done or result.truncated:
                    break
            traces.append((trace, env.world))
        assert traces[0] == traces[1]


INVALID = [
    '{"action_type":"click","index":99}',
    '{"action_type":"long_press","index":0}',
    '{"action_type":"type","index":0,"text":"x"}',
    '{"action_type":"type","text":"x"}',
    '{"action_type":"scroll","direction":"left"}',
    '{"action_type":"open_app","app_name":"Calculator"}',
    '{"action_type":"keyboard_enter"}',
    '{"action_type":"click","x":5000,"y":10}',
    "tap the settings icon",
    '{"action_type":"click"}',
    '{"action_type":"select","index":0,"text":"x"}',
    '{"action_type":"drag","index":0,"target":1}',
]


async def test_invalid_actions_are_reported_with_reasons_and_leave_the_world_unchanged() -> None:
    rng = random.Random(3)
    env = SimEnv()
    seen_invalid: Counter[str] = Counter()
    for task in sim_tasks("train", 84):
        obs = await env.reset(task)
        for _ in range(3):
            # Wander a little so invalid actions are tried on many screens, not just the home screen.
            result = await env.step(rng.choice(env.candidates(obs)))
            obs = result.observation
            if result.done or result.truncated:
                break
        else:
            for text in rng.sample(INVALID, len(INVALID)):
                before, steps = env.world.clone(), env.steps
                result = await env.step(text)
                if not result.info.valid:  # some are fine on some screens (typing into a focused field)
                    seen_invalid[text] += 1
                    assert result.info.reason, text
                    assert result.reward == 0.0 and not result.info.success
                    assert env.world == before, f"{text} changed the world on {obs.screen.splitlines()[0]}"
                    assert result.observation == obs
                    assert env.steps == steps + 1  # invalid actions still use up the horizon
                obs = result.observation
                if result.done or result.truncated:
                    break
    assert set(seen_invalid) == set(INVALID) and sum(seen_invalid.values()) >= 200


async def test_back_and_home_on_the_home_screen_are_invalid() -> None:
    env = SimEnv()
    await env.reset(sim_tasks("train", 1)[0])
    for text in ('{"action_type":"navigate_back"}', '{"action_type":"navigate_home"}'):
        result = await env.step(text)
        assert not result.info.valid and result.info.reason == "already on the home screen"


def test_train_and_test_splits_are_disjoint() -> None:
    train, test = sim_tasks("train", 28 * 20), sim_tasks("test", 28 * 10)
    assert {t.id for t in train}.isdisjoint({t.id for t in test})
    assert {t.template for t in test} == set(TEMPLATES)
    assert all(t.split == "train" for t in train) and all(t.split == "test" for t in test)
    for name, template in TEMPLATES.items():
        if template.split_on == "instruction":
            train_instr = {t.instruction for t in train if t.template == name}
            test_instr = {t.instruction for t in test if t.template == name}
            assert train_instr.isdisjoint(test_instr), name


def test_thousands_of_distinct_tasks() -> None:
    tasks = sim_tasks("train", 2000)
    assert len({t.id for t in tasks}) == 2000
    worlds = {(t.instruction, repr(instantiate(TEMPLATES[t.template], t.seed)[1])) for t in tasks}
    assert len(worlds) >= 1990


def test_screens_stay_small_enough_for_a_tiny_model() -> None:
    rng = random.Random(5)
    for task in sim_tasks("train", 28 * 6):
        template = TEMPLATES[task.template]
        _, world, _ = instantiate(template, task.seed)
        for _ in range(15):
            obs = observe(world, task)
            options = candidate_actions(obs, task)
            assert len(obs.text) <= 400 and len(obs.elements) <= 10 and 1 <= len(options) <= 12, obs.text
            assert len(set(options)) == len(options)
            action = parse_action(rng.choice(options))
            assert not isinstance(action, InvalidAction)
            assert world.apply(action).valid, (obs.text, action)


def test_the_oracle_action_is_determined_by_what_the_agent_sees() -> None:
    """No hidden state: the same task and screen text always call for the same next action, even after detours."""
    rng = random.Random(11)
    wanted: dict[str, set[str]] = {}
    for task in sim_tasks("train", 28 * 20):
        template = TEMPLATES[task.template]
        params, world, _ = instantiate(template, task.seed)
        ops = template.ops(params)
        for _ in range(rng.randint(0, 2)):
            world.apply(parse_action(rng.choice(candidate_actions(observe(world, task), task))))  # type: ignore[arg-type]
        while not template.success(world, params):
            action = next_oracle_action(world, ops)
            assert action is not None
            wanted.setdefault(observe(world, task).text, set()).add(action.to_text())
            world.apply(action)
    ambiguous = {text: actions for text, actions in wanted.items() if len(actions) > 1}
    assert not ambiguous, next(iter(ambiguous.items()))


def test_typed_text_candidates_carry_the_needed_text_among_distractors() -> None:
    tasks = sim_tasks("train", 28 * 10)
    for task in tasks:
        for field, param in FIELD_PARAM.items():
            texts = field_texts(task, field)
            assert len(set(texts)) == len(texts) == 3 and field_texts(task, field) == texts
            if task.param(param) in FIELD_VOCAB[field]:
                assert task.param(param) in texts
    # The needed text moves around, so its position tells the policy nothing.
    alarms = [t for t in tasks if t.template == "set_alarm"]
    assert len({field_texts(t, "Time").index(t.param("time")) for t in alarms}) == 3


def shortest_by_search(task: Task, limit: int) -> int | None:
    """Breadth-first search over candidate actions: the length of a shortest solution up to ``limit`` steps."""
    template = TEMPLATES[task.template]
    params, start, _ = instantiate(template, task.seed)
    frontier = deque([(start, 0)])
    seen = {repr(start)}
    while frontier:
        world, depth = frontier.popleft()
        if depth == limit:
            continue
        for text in candidate_actions(observe(world, task), task):
            nxt = world.clone()
            nxt.apply(parse_action(text))  # type: ignore[arg-type]
            if template.success(nxt, params):
                return depth + 1
            key = repr(nxt)
            if key not in seen:
                seen.add(key)
                frontier.append((nxt, depth + 1))
    return None


@pytest.mark.parametrize("template", ["turn_on_setting", "display_option", "set_alarm", "delete_alarm", "call_contact"])
def test_oracle_path_is_a_shortest_path_over_the_candidates(template: str) -> None:
    task = make_task(template, 0, "train")
    oracle_length = task.horizon - HORIZON_SLACK
    assert shortest_by_search(task, oracle_length - 1) is None
    assert shortest_by_search(task, oracle_length) == oracle_length


async def test_status_ends_the_episode_without_reward_and_later_steps_raise() -> None:
    env = SimEnv()
    task = sim_tasks("train", 1)[0]
    with pytest.raises(EpisodeStateError):
        await env.step('{"action_type":"wait"}')
    await env.reset(task)
    result = await env.step('{"action_type":"status","goal_status":"complete"}')
    assert result.done and not result.truncated and result.reward == 0.0 and not result.info.success
    with pytest.raises(EpisodeStateError):
        await env.step('{"action_type":"wait"}')


async def test_episode_is_truncated_at_the_horizon() -> None:
    env = SimEnv()
    task = sim_tasks("train", 1)[0]
    await env.reset(task)
    results = [await env.step('{"action_type":"wait"}') for _ in range(task.horizon)]
    assert [r.truncated for r in results] == [False] * (task.horizon - 1) + [True]
    assert not any(r.done for r in results)


async def test_reset_refuses_a_task_its_template_does_not_build() -> None:
    task = sim_tasks("train", 1)[0]
    forged = Task(task.id, "sim", task.template, "Turn on the toaster", "train", 5, task.seed, task.params)
    with pytest.raises(EnvError, match="different version"):
        await SimEnv().reset(forged)


def test_latency_model_spans_about_100x_between_tasks_with_the_configured_mean() -> None:
    model = LatencyModel(mean_s=0.2, sigma=0.5, task_spread=100.0)
    tasks = sim_tasks("train", 1000)
    scales = [model.task_scale(t) for t in tasks]
    assert 60 <= max(scales) / min(scales) <= 100
    assert sum(scales) / len(scales) == pytest.approx(1.0, rel=0.1)
    rng = random.Random(0)
    draws = [model.sample(1.0, rng) for _ in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(0.2, rel=0.05)
    assert LatencyModel(mean_s=0.0).sample(3.0, rng) == 0.0


async def test_latency_is_awaited_and_deterministic_per_seed() -> None:
    task = sim_tasks("train", 1)[0]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    modeled = []
    for _ in range(2):
        env = SimEnv(LatencyModel(mean_s=0.02, task_spread=1.0), seed=4)
        await env.reset(task)
        background = asyncio.create_task(ticker())
        result = await env.step('{"action_type":"wait"}')
        background.cancel()
        modeled.append(result.info.extra["modeled_latency_s"])
        assert result.info.latency_s >= modeled[-1]
    assert ticks > 0  # other coroutines ran while the env waited
    assert modeled[0] == modeled[1] > 0


def test_corpus_is_deterministic_and_covers_what_the_env_shows() -> None:
    corpus = list(sim_corpus(28))
    assert corpus == list(sim_corpus(28))
    texts = set(corpus)
    for task in sim_tasks("train", 28):
        _, world, _ = instantiate(TEMPLATES[task.template], task.seed)
        obs = observe(world, task)
        assert obs.text in texts
        assert set(candidate_actions(obs, task)) <= texts
    assert "Olga" in texts and "555-0199" in texts and "Sudoku Plus" in texts
