"""The collector against a real broker, the session's real vLLM server (tiny model) and the simulated phone."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.collector import Collector
from distrl_stream.config import Config
from distrl_stream.envs import SimEnv, task_pool
from distrl_stream.events import MetricEvent, Termination, decode
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.logprobs import action_logprobs
from distrl_stream.policy.prompt import build_prompt
from distrl_stream.testing.instant_learner import InstantLearner, publish_version
from tests.collector.conftest import ENDED, TopicWatch, assert_complete, metrics, trajectories
from tests.fixtures.vllm import VllmService
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]


async def test_eight_envs_publish_complete_trajectories_that_match_the_envs_and_the_server(
    collector_config: Callable[..., Config], vllm_server: VllmService
) -> None:
    cfg = collector_config(collector={"envs": 8, "max_episodes": 16})
    report = await asyncio.wait_for(Collector(cfg).run(), 180)

    assert report.episodes == 16 and report.published == report.delivered == 16 and report.abandoned == 0
    events = trajectories(cfg)
    assert len(events) == 16 and len({e.episode_id for e in events}) == 16
    pool = {task.id: task for task in task_pool(cfg.env, "train")}
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    for event in events:
        assert_complete(event, cfg)
        assert event.termination in ENDED and event.collector_id == report.collector_id and event.mode == "choice"
        # Replay the recorded actions on a fresh simulator: every observation, candidate list and outcome agrees.
        task = pool[event.task_id]
        assert (event.task_template, event.instruction) == (task.template, task.instruction)
        env = SimEnv()
        obs = await env.reset(task)
        for step in event.steps:
            assert step.observation == obs.screen
            assert step.candidates == env.candidates(obs)
            result = await env.step(step.action_text)
            assert (step.valid, step.reward, step.done) == (result.info.valid, result.reward, result.done)
            assert step.policy_version == 0  # the only version the server serves
            # The token ids are the server's own: they spell the action (plus the stop token).
            assert tokenizer.decode(step.token_ids.to_numpy().tolist(), skip_special_tokens=True) == step.action_text
            obs = result.observation
        assert (event.termination is Termination.TRUNCATED) == result.truncated
        assert len(event.steps) <= task.horizon

    # The learner rebuilds each prompt from the event alone and gets the server's log-probs back.
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    event = max(events, key=lambda e: len(e.steps))
    prompts = [
        build_prompt(event.instruction, s.observation, [p.action_text for p in event.steps[:t]])
        for t, s in enumerate(event.steps)
    ]
    with torch.no_grad():
        learner = action_logprobs(
            model,
            tokenizer,
            prompts,
            [s.token_ids.to_numpy().tolist() for s in event.steps],
            [s.candidates for s in event.steps],
        ).logprob
    behaviour = torch.tensor([s.behaviour_logprob for s in event.steps])
    assert torch.allclose(learner, behaviour, atol=0.1), (learner, behaviour)

    final = [m for m in metrics(cfg) if m.labels.get("event") == "final"]
    assert len(final) == 1 and final[0].source_id == report.collector_id
    assert final[0].values["episodes_total"] == 16 and final[0].values["delivered"] == 16
    assert final[0].values["steps_total"] == sum(len(e.steps) for e in events)


async def test_free_mode_records_the_raw_text_and_the_env_verdict_on_it(
    collector_config: Callable[..., Config],
) -> None:
    cfg = collector_config(inference={"mode": "free", "max_tokens": 24}, collector={"envs": 4, "max_episodes": 4})
    report = await asyncio.wait_for(Collector(cfg).run(), 180)

    assert report.delivered == 4
    pool = {task.id: task for task in task_pool(cfg.env, "train")}
    for event in trajectories(cfg):
        assert event.mode == "free" and event.termination in ENDED
        env = SimEnv()
        obs = await env.reset(pool[event.task_id])
        for step in event.steps:
            assert step.candidates == [] and step.observation == obs.screen
            # The untrained model's free text goes to the env as is; its verdict and reason are recorded.
            result = await env.step(step.action_text)
            assert (step.valid, step.invalid_reason) == (result.info.valid, result.info.reason)
            assert step.action == (result.info.action_text if result.info.valid else "")
            assert step.token_ids.to_numpy().size == step.token_logprobs.to_numpy().size >= 1
            obs = result.observation


async def test_sync_mode_runs_rounds_that_never_mix_versions(
    collector_config: Callable[..., Config],
    noop_adapter: Path,
    weight_watcher: Callable[[Config], WeightWatcher],
) -> None:
    envs, rounds = 4, 3
    cfg = collector_config(collector={"envs": envs, "mode": "sync", "max_episodes": envs * rounds})
    ensure_run_topics(cfg)
    weight_watcher(cfg)
    learner = InstantLearner(cfg, noop_adapter, round_episodes=envs)
    learner.start()
    try:
        report = await asyncio.wait_for(Collector(cfg).run(), 240)
    finally:
        learner.stop()
    assert learner.failed is None
    assert report.rounds == rounds and report.delivered == envs * rounds

    events = sorted(trajectories(cfg), key=lambda e: e.started_at)
    assert len(events) == envs * rounds
    batches = [events[i : i + envs] for i in range(0, len(events), envs)]
    versions = []
    for batch in batches:
        used = {step.policy_version for event in batch for step in event.steps}
        assert len(used) == 1, f"a round mixed versions {used}"
        versions.append(used.pop())
    assert versions == list(range(rounds))  # one new version per round, each served before the round began
    for earlier, later in itertools.pairwise(batches):
        assert max(e.ended_at for e in earlier) <= min(e.started_at for e in later)  # the barrier


async def test_pause_above_policy_lag_pauses_new_episodes_until_the_server_catches_up(
    collector_config: Callable[..., Config],
    noop_adapter: Path,
    weight_watcher: Callable[[Config], WeightWatcher],
) -> None:
    cfg = collector_config(
        collector={"envs": 2, "pause_above_policy_lag": 1, "max_episodes": 2, "metrics_interval_s": 0.3}
    )
    ensure_run_topics(cfg)
    with Producer(cfg.kafka) as producer:
        publish_version(cfg, producer, 3, noop_adapter)  # the learner is at 3, the server at 0
        producer.flush()
    run = asyncio.create_task(Collector(cfg).run())
    watch = TopicWatch(cfg, TopicNames(cfg.run).metrics, 1)
    try:

        def paused_report(values: list[bytes]) -> bool:
            return any(decode(v, MetricEvent).values.get("paused") == 1.0 for v in values)

        await watch.wait_async(paused_report, 60)
    finally:
        watch.close()
    paused = next(m for m in (decode(v, MetricEvent) for v in watch.values) if m.values.get("paused") == 1.0)
    assert paused.values["learner_version"] == 3 and paused.values["policy_version"] == 0
    assert paused.values["episodes_total"] == 0 and paused.values["in_flight"] == 0

    weight_watcher(cfg)  # the server loads version 3: the collector resumes
    report = await asyncio.wait_for(run, 120)
    assert report.delivered == 2
    assert {step.policy_version for event in trajectories(cfg) for step in event.steps} == {3}


async def test_prometheus_endpoint_counts_episodes_steps_and_latencies_while_it_runs(
    collector_config: Callable[..., Config],
) -> None:
    cfg = collector_config(collector={"envs": 2, "metrics_port": 0, "collector_id": "prom-1"})
    collector = Collector(cfg)
    run = asyncio.create_task(collector.run())
    address = ""

    async def scraped(predicate: Callable[[list], bool], timeout_s: float = 120.0) -> list:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            assert not run.done(), run
            if collector.prometheus.port is not None:
                samples = await asyncio.to_thread(scrape, f"127.0.0.1:{collector.prometheus.port}")
                if predicate(samples):
                    return samples
            assert asyncio.get_running_loop().time() < deadline, "the endpoint never showed 4 delivered episodes"
            await asyncio.sleep(0.2)

    try:
        samples = await scraped(lambda s: (value(s, "distrl_collector_trajectories_delivered_total") or 0) >= 4)
        address = f"127.0.0.1:{collector.prometheus.port}"
    finally:
        collector.request_stop()
        report = await asyncio.wait_for(run, 120)
    labels = {"run": cfg.run, "role": "collector", "source": "prom-1"}
    episodes = value(samples, "distrl_collector_episodes_total", **labels)
    steps = value(samples, "distrl_collector_steps_total", **labels)
    assert episodes >= 4 and steps >= episodes
    assert value(samples, "distrl_collector_episode_duration_seconds_count") == episodes
    assert value(samples, "distrl_collector_inference_latency_seconds_count") == steps
    assert value(samples, "distrl_collector_inference_latency_seconds_sum") > 0
    assert value(samples, "distrl_collector_successes_total") == value(
        samples, "distrl_collector_episodes_total", termination="success"
    )
    assert 0 <= value(samples, "distrl_collector_success_rate") <= 1
    assert value(samples, "distrl_collector_policy_version") == 0
    assert report.episodes >= episodes
    with pytest.raises(httpx.ConnectError):  # the endpoint closes with the collector
        httpx.get(f"http://{address}/metrics", timeout=5.0)
