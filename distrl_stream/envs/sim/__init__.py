"""The simulated phone: a deterministic app/screen world with task templates, an oracle and a latency model."""

from distrl_stream.envs.sim.env import LatencyModel, SimEnv, candidate_actions, observe, sim_corpus
from distrl_stream.envs.sim.templates import TEMPLATES, field_texts, make_task, sim_tasks, solve

__all__ = [
    "TEMPLATES",
    "LatencyModel",
    "SimEnv",
    "candidate_actions",
    "field_texts",
    "make_task",
    "observe",
    "sim_corpus",
    "sim_tasks",
    "solve",
]
