"""Environments: the DeviceEnv protocol, the action space, the simulated phone, MiniWoB++ and Android adapters.

The names a collector or a model builder needs are importable from here; MiniWoB (selenium) and Android load only
when used.
"""

from distrl_stream.envs.actions import Action, ActionType, InvalidAction, parse_action, render_action
from distrl_stream.envs.base import DeviceEnv, Observation, StepInfo, StepResult, Task, UIElement
from distrl_stream.envs.factory import make_env
from distrl_stream.envs.judge import JudgedEnv, LLMJudge, Verdict
from distrl_stream.envs.sim import LatencyModel, SimEnv, sim_corpus, sim_tasks
from distrl_stream.envs.tasks import CurriculumSampler, TaskSampler, UniformSampler, make_sampler, task_pool

__all__ = [
    "Action",
    "ActionType",
    "CurriculumSampler",
    "DeviceEnv",
    "InvalidAction",
    "JudgedEnv",
    "LLMJudge",
    "LatencyModel",
    "Observation",
    "SimEnv",
    "StepInfo",
    "StepResult",
    "Task",
    "TaskSampler",
    "UIElement",
    "UniformSampler",
    "Verdict",
    "make_env",
    "make_sampler",
    "parse_action",
    "render_action",
    "sim_corpus",
    "sim_tasks",
    "task_pool",
]
