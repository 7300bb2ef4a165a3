"""The collector against a real broker, the session's real vLLM server (tiny model) and the simulated phone."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.artifacts import model_fingerprint, sha256_dir
from distrl_stream.collector import Collector
from distrl_stream.config import Config, InferenceConfig, ModelConfig
from distrl_stream.envs import Observation, SimEnv, Task, task_pool
from distrl_stream.errors import EnvError
from distrl_stream.events import MetricEvent, Termination, TrajectoryEvent, decode, utc_now
from distrl_stream.inference.client import InferenceClient, root_sha256
from distrl_stream.inference.server import InferenceServer
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.logprobs import action_logprobs
from distrl_stream.policy.prompt import build_prompt
from distrl_stream.testing.instant_learner import InstantLearner, publish_version, write_noop_adapter
from tests.collector.conftest import (
    ENDED,
    TopicWatch,
    assert_complete,
    metrics,
    start_cli,
    trajectories,
    trajectory_watch,
)
from tests.fixtures.vllm import VllmService
from tests.monitor.scrape import scrape, value

pytestmark = [pytest.mark.kafka, pytest.mark.vllm]


async def test_eight_envs_publish_complete_trajectories_that_match_the_envs_and_the_server(
    collector_config: Callable[..., Config], vllm_server: VllmService
) -> None:
    cfg = collector_config(model={"base": vllm_server.model_dir}, collector={"envs": 8, "max_episodes": 16})
    report = await asyncio.wait_for(Collector(cfg).run(), 180)

    assert report.episodes == 16 and report.published == report.delivered == 16 and report.abandoned == 0
    events = trajectories(cfg)
    assert len(events) == 16 and len({e.episode_id for e in events}) == 16
    pool = {task.id: task for task in task_pool(cfg.env, "train")}
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    for event in events:
        assert_complete(event, cfg)
        assert event.termination in ENDED and event.collector_id == report.collector_id and event.mode == "choice"
        # The base model's fingerprint, with which the learner tells a same-named other model apart.
        assert event.base_fingerprint == model_fingerprint(vllm_server.model_dir)
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
            # The only version the server serves, named with the server that answered.
            assert (step.policy_version, step.server, step.adapter_sha256) == (0, vllm_server.url, None)
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


class FailsFirstReset(SimEnv):
    """A sim env whose first reset fails: its episode ends before its first step."""

    failed = False

    async def reset(self, task: Task) -> Observation:
        if not FailsFirstReset.failed:
            FailsFirstReset.failed = True
            raise EnvError("the device did not answer")
        return await super().reset(task)


async def test_a_sync_round_with_an_attempt_that_failed_before_its_first_step_still_ends_in_a_version(
    collector_config: Callable[..., Config],
    noop_adapter: Path,
    weight_watcher: Callable[[Config], WeightWatcher],
) -> None:
    # Were the failed attempt not published, the round would lack it and the collector would wait out the timeout.
    envs = 2
    FailsFirstReset.failed = False  # shared by the collector's envs: only the first reset of the test fails
    cfg = collector_config(
        collector={"envs": envs, "mode": "sync", "max_episodes": 2 * envs, "sync_version_timeout_s": 600}
    )
    ensure_run_topics(cfg)
    weight_watcher(cfg)
    learner = InstantLearner(cfg, noop_adapter, round_episodes=envs)
    learner.start()
    try:
        report = await asyncio.wait_for(Collector(cfg, env_factory=FailsFirstReset).run(), 120)
    finally:
        learner.stop()
    assert learner.failed is None and report.rounds == 2 and learner.version >= 1
    events = trajectories(cfg)
    assert len(events) == 2 * envs  # every attempt is on the topic
    [failed] = [e for e in events if not e.steps]
    assert failed.termination is Termination.ENV_ERROR


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


async def test_two_collectors_over_two_servers_route_around_a_killed_one_and_record_what_each_server_loaded(
    collector_config: Callable[..., Config],
    vllm_server: VllmService,
    tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    """One collector in this process, one `collect` process given both servers by the repeated flag; the second
    server is killed once both collectors have published steps it answered, and both go on with the first."""
    began = time.monotonic()
    # A second server on the same model; its short stop grace makes stop() a kill.
    second = InferenceServer(
        vllm_server.model_dir,
        InferenceConfig(port=0, device="cpu", startup_timeout_s=240.0, stop_timeout_s=1.0),
        ModelConfig(),
        tmp_path / "second.log",
    )
    await asyncio.to_thread(second.start)
    cli: subprocess.Popen[str] | None = None
    watch: TopicWatch | None = None
    try:
        # Version 1 on the first server only, staged as the weight watcher stages it: <served name>-<sha256>.
        adapter = write_noop_adapter(vllm_server.model_dir, tmp_path / "adapter", ModelConfig())
        sha = sha256_dir(adapter)
        staged = tmp_path / "staging" / f"policy-v1-{sha}"
        shutil.copytree(adapter, staged)
        httpx.post(
            f"{vllm_server.url}/v1/load_lora_adapter",
            json={"lora_name": "policy-v1", "lora_path": str(staged)},
            timeout=60,
        ).raise_for_status()
        listed = {m["id"]: m["root"] for m in httpx.get(f"{vllm_server.url}/v1/models", timeout=30).json()["data"]}
        assert root_sha256(listed["policy-v1"]) == sha
        # A fresh server's first request is slow (warm-up): taken here, so that it does not hold the collectors'.
        async with InferenceClient(vllm_server.inference, base_url=second.url) as warm:
            await asyncio.wait_for(warm.act("warm-up", ['{"action_type":"wait"}']), 120)

        cfg = collector_config(
            inference={"urls": [vllm_server.url, second.url], "server_backoff_s": 5.0},
            collector={"envs": 2, "collector_id": "in-process"},
        )
        ensure_run_topics(cfg)
        watch = trajectory_watch(cfg)
        # start_cli passes --inference-url <first server>; the repeated flag adds the second.
        cli = start_cli(
            cfg,
            tmp_path / "cli.log",
            *("--inference-url", second.url, "--envs", "2", "--episodes", "8", "--collector-id", "cli"),
            env={"DISTRL_INFERENCE__SERVER_BACKOFF_S": "5"},
        )
        collector = Collector(cfg)
        run = asyncio.create_task(collector.run())

        def both_acted_with_the_second(values: list[bytes]) -> bool:
            events = [decode(v, TrajectoryEvent) for v in values]
            return all(
                any(s.server == second.url for e in events if e.collector_id == collector_id for s in e.steps)
                for collector_id in ("in-process", "cli")
            )

        await watch.wait_async(both_acted_with_the_second, 240)
        await asyncio.to_thread(second.stop)
        killed_at = utc_now()
        out, _ = await asyncio.to_thread(cli.communicate, timeout=240)
        assert cli.returncode == 0, (tmp_path / "cli.log").read_text()[-3000:]

        def two_episodes_after_the_kill(values: list[bytes]) -> bool:
            events = [decode(v, TrajectoryEvent) for v in values]
            return sum(e.collector_id == "in-process" and e.started_at > killed_at for e in events) >= 2

        await watch.wait_async(two_episodes_after_the_kill, 240)
        collector.request_stop()
        report = await asyncio.wait_for(run, 240)
        failovers = collector.prometheus.registry.get_sample_value(
            "distrl_collector_server_failovers_total",
            {"run": cfg.run, "role": "collector", "source": "in-process", "server": second.url},
        )
    finally:
        if watch is not None:
            watch.close()
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        await asyncio.to_thread(second.stop)
        vllm_server.unload_all_adapters()

    cli_report = json.loads(out)
    assert cli_report["episodes"] == 8 and cli_report["by_termination"].get("inference_error", 0) == 0
    events = trajectories(cfg)
    assert len(events) == report.delivered + cli_report["delivered"]
    assert [e.termination for e in events if e.termination is Termination.INFERENCE_ERROR] == []
    steps = [s for e in events for s in e.steps]
    # Every step names what the server that answered it had loaded: version and adapter sha256 together.
    assert {(s.server, s.policy_version, s.adapter_sha256) for s in steps} == {
        (vllm_server.url, 1, sha),
        (second.url, 0, None),
    }
    for collector_id in ("in-process", "cli"):
        used = {s.server for e in events if e.collector_id == collector_id for s in e.steps}
        assert used == {vllm_server.url, second.url}, collector_id
    after_kill = [s for e in events if e.started_at > killed_at for s in e.steps]
    assert after_kill and {s.server for s in after_kill} == {vllm_server.url}
    assert failovers is not None and failovers >= 1
    record_property("two_servers_one_killed_s", time.monotonic() - began)
    print(f"two servers, one killed: {len(events)} episodes, {len(steps)} steps in {time.monotonic() - began:.0f}s")
