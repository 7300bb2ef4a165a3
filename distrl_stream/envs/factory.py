"""Build the configured environment: ``make_env(config.env)``."""

from __future__ import annotations

from distrl_stream.config import EnvConfig
from distrl_stream.envs.base import DeviceEnv
from distrl_stream.envs.judge import JudgedEnv, LLMJudge
from distrl_stream.envs.sim import LatencyModel, SimEnv


def make_env(section: EnvConfig) -> DeviceEnv:
    """A fresh environment of the configured kind, wrapped with the LLM judge when ``judge = "llm"``.

    Nothing is started here: a MiniWoB browser starts on the first ``reset``, an adb device is first contacted then.
    Each call returns a new instance; a collector makes one per concurrent episode.
    """
    env: DeviceEnv
    if section.kind == "sim":
        latency = None
        if section.latency == "lognormal":
            latency = LatencyModel(section.latency_mean_s, section.latency_sigma, section.latency_task_spread)
        env = SimEnv(latency=latency, seed=section.seed, screenshots=section.screenshots)
    elif section.kind == "miniwob":
        from distrl_stream.envs.miniwob import MiniWoBEnv

        env = MiniWoBEnv.from_config(section)
    elif section.kind == "browsergym":
        from distrl_stream.envs.browsergym import BrowserGymEnv

        env = BrowserGymEnv.from_config(section)
    elif section.kind == "gymnasium":
        from distrl_stream.envs.gymnasium import GymnasiumEnv

        env = GymnasiumEnv.from_config(section)
    else:
        from distrl_stream.envs.android import AndroidEnv

        env = AndroidEnv.from_config(section)
    if section.judge == "llm":
        assert section.judge_url is not None  # EnvConfig validates judge_url and judge_model together
        key = section.judge_api_key.get_secret_value() if section.judge_api_key is not None else None
        judge = LLMJudge(section.judge_url, section.judge_model, key, section.judge_timeout_s)
        env = JudgedEnv(env, judge, section.judge_on)
    return env
