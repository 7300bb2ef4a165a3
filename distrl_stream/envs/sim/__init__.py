"""The simulated phone: a deterministic app/screen world with task templates, an oracle, latency, and PNG screens."""

from distrl_stream.envs.sim.env import LatencyModel, SimEnv, candidate_actions, observe, sim_corpus
from distrl_stream.envs.sim.render import screen_png
from distrl_stream.envs.sim.templates import TEMPLATES, field_texts, make_task, sim_tasks, solve

__all__ = [
    "TEMPLATES",
    "LatencyModel",
    "SimEnv",
    "candidate_actions",
    "field_texts",
    "make_task",
    "observe",
    "screen_png",
    "sim_corpus",
    "sim_tasks",
    "solve",
]
