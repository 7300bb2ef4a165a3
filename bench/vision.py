"""The cost of seeing: a vision policy (screenshot + text) against the same model reading text only.

One model, tiny-vl (docs/design.md §6.1), one vLLM server, the same sim tasks in the same order; the two arms differ
only in whether the policy reads the screenshot:

- **text**: the chat prompt without an image part, through vLLM's completions endpoint; the simulator draws no
  screenshots;
- **vision**: the same prompt with the screen's PNG as the user message's first part, through the chat endpoint; the
  simulator draws each screen and the collector stores it in the claim-check store.

Measured, the arms interleaved round by round so drift on the shared cores hits both alike:

- **collection**: steps/s of ``envs`` concurrent episodes (the collector's own ``run_episode`` loop, the base
  version, choice mode), ``ratio`` = vision ÷ text;
- **learner**: A-RIDE updates/s on the *same* episodes (those the vision arm collected; the text learner ignores
  their screenshots), one torch thread, after a warm-up update each;
- **parity**: |served log μ − learner log π| on each arm's own steps (the base model, at the server's default dtype),
  as for text (docs/policy.md);
- **bytes per step**: on the wire (the Avro TrajectoryEvent of each arm ÷ its steps: a claim check adds a URI and a
  digest, never the image) and in the store (PNG bytes written ÷ steps: identical screens are stored once; and the
  mean PNG size).

Usage: ``python bench/vision.py [--quick]`` writes ``bench/results/vision.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from distrl_stream.cli.bench import write_results
from distrl_stream.collector import run_episode
from distrl_stream.config import InferenceConfig, LearnerConfig, ModelConfig
from distrl_stream.envs.base import Task
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.events import TrajectoryEvent, encode
from distrl_stream.events.screenshots import ScreenshotStore
from distrl_stream.inference.client import InferenceClient
from distrl_stream.inference.server import InferenceServer
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.records import EpisodeRecord, episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from distrl_stream.policy.logprobs import action_logprobs, text_tokenizer
from distrl_stream.policy.model import build_model
from distrl_stream.policy.prompt import Prompter
from distrl_stream.policy.vision import load_processor

PARITY_STEPS = 200
ARMS = ("text", "vision")


@dataclass
class Arm:
    """What one arm collected and how long it took."""

    events: list[TrajectoryEvent] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


async def collect_round(
    client: InferenceClient, tasks: list[Task], prompter: Prompter, store: ScreenshotStore | None, envs: int
) -> tuple[list[TrajectoryEvent], float]:
    """Run ``tasks`` on ``envs`` concurrent simulators with the served base policy; the events and the seconds."""
    queue = list(tasks)
    events: list[TrajectoryEvent] = []

    async def worker() -> None:
        env = SimEnv(screenshots=store is not None)
        while queue:
            task = queue.pop(0)
            outcome = await run_episode(
                env, task, client, "choice", episode_id=uuid.uuid4().hex, screenshots=store, prompter=prompter
            )
            events.append(outcome.to_event(run="bench", collector_id="bench", mode="choice", base_model="tiny-vl"))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(envs)))
    return events, time.perf_counter() - started


async def collection(
    model_dir: Path, store_dir: Path, tasks: list[Task], rounds: int, envs: int, progress: Progress
) -> dict[str, Arm]:
    """Both arms on one server, alternating round by round (the order flips every round)."""
    processor = load_processor(model_dir)
    prompters = {"text": Prompter(text_tokenizer(processor)), "vision": Prompter(processor, vision=True)}
    stores = {"text": None, "vision": ScreenshotStore(store_dir)}
    inference = InferenceConfig(port=0, request_timeout_s=120.0, max_connections=envs)
    server = InferenceServer(model_dir, inference, ModelConfig(), store_dir.parent / "vllm.log")
    arms = {name: Arm() for name in ARMS}
    server.start()
    try:
        async with InferenceClient(inference.model_copy(update={"port": server.port})) as client:
            for name in ARMS:  # warm-up: first requests compile grammars and fill caches
                await collect_round(client, tasks[:envs], prompters[name], stores[name], envs)
            job = progress.add_task("collection (text / vision rounds)", total=rounds * 2)
            per_round = len(tasks) // rounds
            for r in range(rounds):
                chunk = tasks[r * per_round : (r + 1) * per_round]
                for name in ARMS if r % 2 == 0 else reversed(ARMS):
                    events, seconds = await collect_round(client, chunk, prompters[name], stores[name], envs)
                    arms[name].events += events
                    arms[name].steps += sum(len(e.steps) for e in events)
                    arms[name].seconds += seconds
                    progress.advance(job)
    finally:
        server.stop()
    return arms


def parity_gaps(trainer: Trainer, episodes: list[EpisodeRecord], limit: int) -> list[float]:
    """|served log μ − learner log π| in nats over the first ``limit`` steps of ``episodes`` (all acted by the base
    model, which a fresh adapter leaves unchanged)."""
    steps = [(e, t) for e in episodes for t in range(len(e))][:limit]
    with torch.no_grad():
        out = action_logprobs(
            trainer.model,
            trainer.tokenizer,
            [trainer.step_prompt(e, t) for e, t in steps],
            [e.steps[t].token_ids for e, t in steps],
            [e.steps[t].candidates for e, t in steps],
            constraint=trainer.constraint,
        )
    served = torch.tensor([e.steps[t].behaviour_logprob for e, t in steps])
    return (out.logprob - served).abs().tolist()


def learner(
    model_dir: Path, arms: dict[str, Arm], updates: int, progress: Progress
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds per A-RIDE update of each arm on the same episodes (the vision arm's), interleaved update by update
    (each buffer draws from its own generator with the same seed, so the batches are alike in size); and each arm's
    behaviour/learner log-prob gaps on the steps it collected."""
    torch.set_num_threads(1)
    cfg = LearnerConfig(batch_episodes=4, min_buffer_episodes=4, priority_refresh_interval=10**9)
    trainers = {}
    gaps = {}
    for name in ARMS:
        model, encoder = load_policy(model_dir, ModelConfig(), vision=name == "vision")
        trainer = Trainer(cfg, model, encoder, ReplayBuffer.from_config(cfg))
        own = [episode_from_event(e, screenshots=name == "vision") for e in arms[name].events]
        gaps[name] = parity_gaps(trainer, own, PARITY_STEPS)
        for event in arms["vision"].events:
            trainer.buffer.add(episode_from_event(event, screenshots=name == "vision"))
        trainer.update("aride", version=0)  # warm-up: allocations settle
        trainers[name] = trainer
    seconds = dict.fromkeys(ARMS, 0.0)
    job = progress.add_task("learner updates (text / vision)", total=updates * 2)
    for u in range(updates):
        for name in ARMS if u % 2 == 0 else reversed(ARMS):
            started = time.perf_counter()
            trainers[name].update("aride", version=0)
            seconds[name] += time.perf_counter() - started
            progress.advance(job)
    return {name: seconds[name] / updates for name in ARMS}, gaps


def wire_bytes_per_step(events: list[TrajectoryEvent]) -> float:
    return sum(len(encode(e)) for e in events) / sum(len(e.steps) for e in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes and updates (about 3 min)")
    parser.add_argument("--envs", type=int, default=8, help="concurrent simulated phones per arm")
    args = parser.parse_args()
    rounds, per_round, updates = (2, 16, 10) if args.quick else (6, 32, 40)
    tasks = sim_tasks("train", rounds * per_round + args.envs)
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp, Progress() as progress:
        model_dir = build_model(Path(tmp) / "tiny-vl", "tiny-vl")
        store_dir = Path(tmp) / "screenshots"
        arms = asyncio.run(collection(model_dir, store_dir, tasks[args.envs :], rounds, args.envs, progress))
        update_s, gaps = learner(model_dir, arms, updates, progress)
        pngs = [p.stat().st_size for p in store_dir.glob("*.png")]
    vision_steps = arms["vision"].steps
    metrics: dict[str, Any] = {
        "model": "tiny-vl",
        "envs": args.envs,
        "episodes_per_arm": len(arms["vision"].events),
        "collection_steps_per_s": {name: arms[name].steps_per_s for name in ARMS},
        "collection_steps": {name: arms[name].steps for name in ARMS},
        "update_s": update_s,
        "updates_per_arm": updates,
        "wire_bytes_per_step": {name: wire_bytes_per_step(arms[name].events) for name in ARMS},
        "store_bytes_per_step": {"text": 0.0, "vision": sum(pngs) / vision_steps},
        "png_bytes_mean": statistics.fmean(pngs),
        "png_files": len(pngs),
        "server_dtype": InferenceConfig().dtype,
        "parity_steps": {name: len(gaps[name]) for name in ARMS},
        "logprob_gap_mean": {name: statistics.fmean(gaps[name]) for name in ARMS},
        "logprob_gap_max": {name: max(gaps[name]) for name in ARMS},
    }
    result = {
        "name": "vision",
        "quick": args.quick,
        # Seeing costs: the vision arm's rate as a fraction of the text arm's, collection and learner.
        "ratio": {
            "collection": arms["vision"].steps_per_s / arms["text"].steps_per_s,
            "learner_updates": update_s["text"] / update_s["vision"],
        },
        "metrics": metrics,
    }
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
