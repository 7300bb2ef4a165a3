"""Synthetic events of realistic shape and size, deterministic per seed: for tests, benchmarks and demos.

A default trajectory has 20 steps with ~500-character screen texts, 5 candidate actions and 16 action tokens per
step (~20 KB of Avro), the size of one episode in docs/design.md §3.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import random
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np

from distrl_stream.events.records import (
    DeadLetter,
    MetricEvent,
    Step,
    Tensor,
    Termination,
    TrajectoryEvent,
    WeightVersionEvent,
    utc_now,
)
from distrl_stream.events.screenshots import ScreenshotStore

_WIDGETS = ("Button", "TextView", "EditText", "ImageButton", "CheckBox", "Switch", "ListItem", "Tab")
# Words of typical Android settings screens: screen text compresses like the real thing, unlike random letters.
_VOCABULARY = (
    "Settings Wi-Fi Bluetooth Network Display Battery Storage Apps Search Home Back Menu Notifications Sound Privacy "
    "Location Security Accounts System About phone Connected devices Airplane mode Mobile data Hotspot Brightness "
    "Dark theme Font size Screen timeout Do not disturb Ringtone Volume Calendar Contacts Messages Camera Photos Clock"
)
_WORDS = _VOCABULARY.split()
_VERBS = ("click", "long_press", "type", "scroll")


def sample_trajectory(
    rng: random.Random,
    *,
    run: str = "sample",
    steps: int = 20,
    observation_chars: int = 500,
    candidates: int = 5,
    action_tokens: int = 16,
    policy_version: int = 0,
) -> TrajectoryEvent:
    """A finished episode with ``steps`` steps; the last one is ``done`` and, half the time, successful."""
    started = utc_now() - timedelta(seconds=steps)
    success = rng.random() < 0.5
    episode = [
        sample_step(
            rng,
            done=i == steps - 1,
            reward=1.0 if success and i == steps - 1 else 0.0,
            observation_chars=observation_chars,
            candidates=candidates,
            action_tokens=action_tokens,
            policy_version=policy_version,
        )
        for i in range(steps)
    ]
    return TrajectoryEvent(
        run=run,
        episode_id=str(uuid.UUID(int=rng.getrandbits(128))),
        collector_id=f"collector-{rng.randrange(8)}",
        env_kind="sim",
        task_id=f"task-{rng.randrange(1000)}",
        task_template="open_setting",
        instruction=f"Open {rng.choice(_WORDS)} and turn on {rng.choice(_WORDS)}",
        split="train",
        mode="choice",
        base_model="tiny-qwen2",
        started_at=started,
        ended_at=started + timedelta(milliseconds=rng.randrange(1000, 60_000)),
        termination=Termination.SUCCESS if success else Termination.TRUNCATED,
        total_reward=sum(s.reward for s in episode),
        success=success,
        steps=episode,
    )


def sample_step(
    rng: random.Random,
    *,
    done: bool = False,
    reward: float = 0.0,
    observation_chars: int = 500,
    candidates: int = 5,
    action_tokens: int = 16,
    policy_version: int = 0,
) -> Step:
    """One step: screen text, candidate actions, the chosen one with its tokens and log-probs."""
    offered = [_action(rng) for _ in range(candidates)]
    chosen = rng.choice(offered) if offered else _action(rng)
    nprng = np.random.default_rng(rng.getrandbits(32))
    logprobs = -nprng.exponential(0.5, action_tokens).astype(np.float32)
    return Step(
        observation=_screen_text(rng, observation_chars),
        candidates=offered,
        action_text=chosen,
        action=chosen,
        valid=True,
        reward=reward,
        done=done,
        behaviour_logprob=float(logprobs.sum()),
        token_ids=Tensor.from_numpy(nprng.integers(0, 32_000, action_tokens, dtype=np.int32)),
        token_logprobs=Tensor.from_numpy(logprobs),
        policy_version=policy_version,
        inference_latency_s=rng.uniform(0.01, 0.5),
        env_latency_s=rng.lognormvariate(-2.0, 1.0),
        server=f"http://policy-{rng.randrange(2)}:8000",
        adapter_sha256=f"{rng.getrandbits(256):064x}" if policy_version else None,
    )


def sample_weight_version(rng: random.Random, *, policy_id: str = "policy", version: int = 1) -> WeightVersionEvent:
    """A weight version of ``policy_id`` as the learner publishes it."""
    return WeightVersionEvent(
        policy_id=policy_id,
        version=version,
        base_model="tiny-qwen2",
        adapter_uri=f"kafka://sample.artifacts/0/{version * 5}-{version * 5 + 4}?artifact={policy_id}/v{version:06d}"
        "&chunks=5",
        sha256=f"{rng.getrandbits(256):064x}",
        size_bytes=rng.randrange(10_000, 10_000_000),
        created_at=utc_now(),
        learner_step=version * 20,
        trajectories_consumed=version * 160,
        metrics={"policy_loss": rng.uniform(-1, 1), "critic_loss": rng.uniform(0, 1)},
        base_fingerprint=f"{rng.getrandbits(256):064x}",
    )


def sample_metric(rng: random.Random, *, run: str = "sample", role: str = "collector") -> MetricEvent:
    """A metric event of one role instance."""
    return MetricEvent(
        run=run,
        role=role,
        source_id=f"{role}-{rng.randrange(8)}",
        timestamp=utc_now(),
        values={"trajectories_per_min": rng.uniform(0, 100), "success_rate": rng.random()},
        labels={"env_kind": "sim"},
    )


def sample_dead_letter(rng: random.Random, *, topic: str = "sample.trajectories") -> DeadLetter:
    """A dead letter for a garbage record."""
    return DeadLetter(
        topic=topic,
        partition=rng.randrange(4),
        offset=rng.randrange(1_000_000),
        key=b"episode-key",
        value=rng.randbytes(64),
        error_class="EventDecodeError",
        error_message="cannot decode event: bad magic byte",
        timestamp=utc_now(),
        consumer="learner-0",
        original_timestamp=utc_now(),
    )


def _action(rng: random.Random) -> str:
    verb = rng.choice(_VERBS)
    args: dict[str, object] = {"action_type": verb, "index": rng.randrange(30)}
    if verb == "type":
        args["text"] = rng.choice(_WORDS)
    elif verb == "scroll":
        args["direction"] = rng.choice(("up", "down"))
    return json.dumps(args, separators=(",", ":"))


def _screen_text(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        line = f"[{len(lines)}] {rng.choice(_WIDGETS)} '{' '.join(rng.choices(_WORDS, k=rng.randrange(1, 4)))}'"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


def png(size: tuple[int, int], colour: tuple[int, int, int]) -> bytes:
    """A plain PNG of one colour."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def with_screenshots(event: TrajectoryEvent, shots: list[bytes], folder: Path) -> TrajectoryEvent:
    """``event`` with its steps' screenshots stored in ``folder`` as a collector stores them (one per step)."""
    store = ScreenshotStore(folder)
    checks = [asyncio.run(store.put(shot)) for shot in shots]
    steps = [
        dataclasses.replace(step, screenshot_uri=uri, screenshot_sha256=sha256)
        for step, (uri, sha256) in zip(event.steps, checks, strict=True)
    ]
    return dataclasses.replace(event, steps=steps)
