"""Task pools, samplers and the environment factory."""

from __future__ import annotations

from collections import Counter

import pytest

from distrl_stream.config import load_config
from distrl_stream.envs import DeviceEnv, JudgedEnv, SimEnv, TaskSampler, UniformSampler, make_env, task_pool
from distrl_stream.envs.android import AndroidEnv
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.tasks import CurriculumSampler, make_sampler
from distrl_stream.errors import ConfigError


def test_sim_pool_respects_templates_and_size() -> None:
    section = load_config(env={"templates": ["set_alarm", "take_photo"], "pool_size": 10}).env
    pool = task_pool(section, "train")
    assert len(pool) == 10 and {t.template for t in pool} == {"set_alarm", "take_photo"}
    assert {t.split for t in task_pool(section, "test", 4)} == {"test"}


def test_unknown_sim_template_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"env\.templates: unknown sim templates"):
        task_pool(load_config(env={"templates": ["make_coffee"]}).env, "train")


def test_miniwob_pool_uses_disjoint_seeds_per_split() -> None:
    section = load_config(env={"kind": "miniwob", "miniwob_tasks": ["click-test", "enter-text"]}).env
    train, test = task_pool(section, "train", 6), task_pool(section, "test", 6)
    assert [t.template for t in train[:2]] == ["click-test", "enter-text"]
    assert {t.seed for t in train}.isdisjoint({t.seed for t in test})
    assert all(t.env == "miniwob" and t.horizon >= 3 for t in train + test)


def test_android_pool_comes_from_configured_instructions() -> None:
    section = load_config(env={"kind": "android", "android_tasks": ["Turn on Wi-Fi", "Open Clock"]}).env
    pool = task_pool(section, "test")
    assert [t.instruction for t in pool] == ["Turn on Wi-Fi", "Open Clock"] and pool[0].horizon == 15
    with pytest.raises(ConfigError, match=r"env\.android_tasks"):
        task_pool(load_config(env={"kind": "android"}).env, "train")


def test_uniform_sampler_is_deterministic_per_seed_and_covers_the_pool() -> None:
    section = load_config(env={"pool_size": 20, "seed": 3}).env
    a, b = make_sampler(section), make_sampler(section)
    draws_a, draws_b = [a.sample().id for _ in range(200)], [b.sample().id for _ in range(200)]
    assert draws_a == draws_b
    assert draws_a != [make_sampler(section.model_copy(update={"seed": 4})).sample().id for _ in range(200)]
    assert set(draws_a) == {t.id for t in a.tasks}
    assert isinstance(a, TaskSampler)
    with pytest.raises(ValueError):
        UniformSampler([])


def test_make_env_builds_each_kind_without_starting_anything() -> None:
    assert isinstance(make_env(load_config().env), SimEnv)
    assert isinstance(make_env(load_config(env={"kind": "miniwob"}).env), MiniWoBEnv)
    android = make_env(load_config(env={"kind": "android", "adb_path": "/nonexistent/adb"}).env)
    assert isinstance(android, AndroidEnv)
    judged = make_env(load_config(env={"judge": "llm", "judge_url": "http://127.0.0.1:9/v1", "judge_model": "m"}).env)
    assert isinstance(judged, JudgedEnv) and isinstance(judged.env, SimEnv)
    for env in (android, judged):
        assert isinstance(env, DeviceEnv)


def test_llm_judge_without_endpoint_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs judge_url and judge_model"):
        load_config(env={"judge": "llm"})


def _template_counts(sampler: CurriculumSampler, draws: int = 2000) -> Counter[str]:
    return Counter(sampler.sample().template for _ in range(draws))


def test_curriculum_draws_templates_at_the_edge_of_ability_most() -> None:
    section = load_config(env={"templates": ["take_photo", "alarm_on", "turn_on_setting"], "pool_size": 60}).env
    sampler = CurriculumSampler(task_pool(section, "train"), window=10, seed=1)
    before = _template_counts(sampler)
    assert min(before.values()) > 500  # nothing known yet: every template as likely
    by_template = {t.template: t for t in task_pool(section, "train")}
    for k in range(10):
        sampler.update(by_template["take_photo"], True)  # mastered
        sampler.update(by_template["alarm_on"], k % 2 == 0)  # half the time: the edge
        sampler.update(by_template["turn_on_setting"], False)  # out of reach for now
    after = _template_counts(sampler)
    assert after["alarm_on"] > 0.6 * 2000  # weight 0.3 of 0.4
    assert 0 < after["take_photo"] < 0.2 * 2000 and 0 < after["turn_on_setting"] < 0.2 * 2000  # the floor keeps them

    # Only the last `window` outcomes count: the failing template becomes learnable, and is drawn more again.
    for k in range(10):
        sampler.update(by_template["turn_on_setting"], k % 2 == 0)
    assert _template_counts(sampler)["turn_on_setting"] > after["turn_on_setting"] * 3


def test_make_sampler_gives_the_curriculum_for_train_and_uniform_for_test() -> None:
    section = load_config(env={"task_sampler": "curriculum", "pool_size": 10}).env
    assert isinstance(make_sampler(section, "train"), CurriculumSampler)
    assert isinstance(make_sampler(section, "test"), UniformSampler)
    assert isinstance(make_sampler(load_config().env, "train"), UniformSampler)
    assert isinstance(make_sampler(section, "train"), TaskSampler)
