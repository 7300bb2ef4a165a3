"""A real pretrained model served by vLLM: SmolLM2-135M-Instruct with chat prompts, log-probability parity with the
learner, and a LoRA version trained on it hot-loaded from Kafka."""

from __future__ import annotations

import asyncio
import os
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from distrl_stream.artifacts import dir_size, model_fingerprint, publish, sha256_dir
from distrl_stream.collector import run_episode
from distrl_stream.config import Config, LearnerConfig, ModelConfig
from distrl_stream.envs.sim import SimEnv, sim_tasks
from distrl_stream.errors import InferenceError
from distrl_stream.events import TrajectoryEvent, WeightVersionEvent, decode, utc_now
from distrl_stream.inference.client import ActionResult, InferenceClient
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.consumer import read_topic
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.learner.buffer import ReplayBuffer
from distrl_stream.learner.records import episode_from_event
from distrl_stream.learner.trainer import Trainer, load_policy
from distrl_stream.policy.precision import resolve_precision
from distrl_stream.policy.prompt import Prompt, Prompter
from distrl_stream.testing.parity import logprob_gaps
from distrl_stream.testing.scripted import ScriptedPolicy
from tests.fixtures.vllm import VllmService, train_sft_adapter

pytestmark = pytest.mark.vllm

# Server and learner both at the precision `auto` picks on this CPU (the pretrained profile serves `auto`): bf16 where
# the CPU has bf16 units, whose learner autocast and vLLM kernels round differently (0.075 nats mean per action, 0.38
# at worst, docs/learner.md "Precision"), float32 elsewhere (0.0000 measured).
PRECISION = resolve_precision("auto", "cpu", role="learner")
MAX_MEAN_GAP = 0.1


def _sim_states(tokenizer: PreTrainedTokenizerBase, n: int) -> list[tuple[str, list[str]]]:
    """(chat prompt, candidates) of the states a random policy visits on the sim's templates."""
    states: list[tuple[str, list[str]]] = []

    class Keep(ScriptedPolicy):
        async def act(self, prompt: str, candidates=None, *, mode: str = "choice") -> ActionResult:  # type: ignore[no-untyped-def]
            states.append((prompt, list(candidates or ())))
            return await super().act(prompt, candidates, mode=mode)

    rng = random.Random(0)
    tasks = sim_tasks("train", 100)
    env = SimEnv()
    while len(states) < n:
        policy = Keep(env, tokenizer, noise=1.0, rng=rng)
        asyncio.run(run_episode(env, rng.choice(tasks), policy, "choice", episode_id="e", prompter=Prompter(tokenizer)))
    return states[:n]


@contextmanager
def every_core() -> Iterator[None]:
    """Torch on every core for a pass while the server has nothing to answer (about 1.5x faster on two cores, here
    the tests' longest part), then one thread again, as these tests run beside the server."""
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def states(tokenizer: PreTrainedTokenizerBase) -> list[tuple[str, list[str]]]:
    return _sim_states(tokenizer, 60)


async def _act(service: VllmService, states: list[tuple[str, list[str]]]) -> list[ActionResult]:
    async with InferenceClient(service.inference, service.policy_id) as client:
        await client.refresh_versions()
        return await asyncio.gather(*(client.act(p, c, mode="choice") for p, c in states))


def test_smollm2_answers_chat_prompts_with_candidates_and_the_learner_reproduces_its_log_probs(
    smollm2_server: VllmService,
    tokenizer: PreTrainedTokenizerBase,
    states: list[tuple[str, list[str]]],
    record_property: pytest.RecordProperty,
) -> None:
    torch.set_num_threads(1)
    results = asyncio.run(_act(smollm2_server, states))
    assert all(r.text in c for r, (_, c) in zip(results, states, strict=True))
    assert {(r.version, r.finish_reason) for r in results} == {(0, "stop")}
    # The server tokenised the chat prompt exactly as the learner does, and stopped on the template's end token.
    assert all(list(r.prompt_token_ids) == tokenizer(p)["input_ids"] for r, (p, _) in zip(results, states, strict=True))
    assert all(r.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>") for r in results)
    model = AutoModelForCausalLM.from_pretrained(smollm2_server.model_dir, dtype=torch.float32).eval()
    with every_core():
        gaps = logprob_gaps(
            model, tokenizer, [p for p, _ in states], results, [c for _, c in states], batch_size=8, precision=PRECISION
        )
    mean, worst = statistics.fmean(gaps), max(gaps)
    record_property("smollm2_choice_mean_abs_gap_nats", mean)
    record_property("smollm2_choice_max_abs_gap_nats", worst)
    print(f"SmolLM2 choice mode: mean |gap| {mean:.4f} nats, max {worst:.4f} over {len(gaps)} actions")
    assert mean < MAX_MEAN_GAP


@pytest.fixture
def weights_config(make_config: Callable[..., Config], smollm2_server: VllmService) -> Iterator[Config]:
    cfg = make_config(model={"base": str(smollm2_server.model_dir)})
    ensure_run_topics(cfg)
    yield cfg
    smollm2_server.unload_all_adapters()


@pytest.mark.kafka
def test_a_lora_version_trained_on_smollm2_is_hot_loaded_from_kafka_and_served(
    smollm2_server: VllmService,
    tokenizer: PreTrainedTokenizerBase,
    states: list[tuple[str, list[str]]],
    weights_config: Config,
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)

    def target_of(candidates: list[str]) -> str:
        return candidates[-1]  # the last candidate of every screen: never what a zero-shot policy prefers

    # 8 steps toward each of 8 screens' target.
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = states[:8]
    actions = [[*tokenizer(target_of(c))["input_ids"], stop] for _, c in trained]
    prompts, candidates = [p for p, _ in trained], [c for _, c in trained]
    with every_core():
        adapter = train_sft_adapter(
            smollm2_server.model_dir, tmp_path / "sft", prompts, actions, candidates, steps=8, lr=5e-3, precision="auto"
        )
    cfg = weights_config
    watcher = WeightWatcher(cfg, smollm2_server.url, model_dir=smollm2_server.model_dir)
    watcher.start()
    try:
        with Producer(cfg.kafka) as producer:
            event = WeightVersionEvent(
                policy_id=cfg.model.policy_id,
                version=1,
                base_model=cfg.model.base_model_id,
                adapter_uri=publish(cfg, 1, adapter, producer),
                sha256=sha256_dir(adapter),
                size_bytes=dir_size(adapter),
                created_at=utc_now(),
                learner_step=8,
                trajectories_consumed=8,
                base_fingerprint=model_fingerprint(smollm2_server.model_dir),
            )
            producer.produce_event(TopicNames(cfg.run).weights, event)
        assert asyncio.run(_until_version(smollm2_server, 1, timeout_s=120.0)), "version 1 was never served"
        results = asyncio.run(_act(smollm2_server, trained))
    finally:
        watcher.stop()
    assert watcher.failed is None
    assert {r.version for r in results} == {1}
    hits = sum(r.text == target_of(c) for r, (_, c) in zip(results, trained, strict=True))
    assert hits >= 6, f"only {hits} of 8 answers are the trained target"
    # The learner holding the same adapter recomputes what version 1 served.
    base = AutoModelForCausalLM.from_pretrained(smollm2_server.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    with every_core():
        gaps = logprob_gaps(model, tokenizer, prompts, results, candidates, batch_size=8, precision=PRECISION)
    print(f"SmolLM2 + LoRA v1: mean |gap| {statistics.fmean(gaps):.4f} nats")
    assert statistics.fmean(gaps) < MAX_MEAN_GAP


async def _until_version(service: VllmService, version: int, *, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with InferenceClient(service.inference, service.policy_id) as client:
        while loop.time() < deadline:
            try:
                if await client.refresh_versions() >= version:
                    return True
            except InferenceError:  # the server answers again once the load is done
                pass
            await asyncio.sleep(0.5)
    return False


class _Recorder:
    """A collector's policy that keeps every answer its client got."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client
        self.results: list[ActionResult] = []

    async def act(
        self, prompt: Prompt, candidates: Sequence[str] | None = None, *, mode: str = "choice"
    ) -> ActionResult:
        result = await self.client.act(prompt, candidates, mode=mode)  # type: ignore[arg-type]
        self.results.append(result)
        return result


@pytest.mark.kafka
def test_the_learner_trains_on_the_prompt_ids_the_server_saw_whatever_its_own_template(
    smollm2_server: VllmService, tokenizer: PreTrainedTokenizerBase, make_config: Callable[..., Config]
) -> None:
    torch.set_num_threads(1)
    cfg = make_config(model={"base": str(smollm2_server.model_dir)})
    topics = ensure_run_topics(cfg)

    async def collect() -> tuple[list[TrajectoryEvent], list[ActionResult]]:
        async with InferenceClient(smollm2_server.inference, smollm2_server.policy_id) as client:
            await client.refresh_versions()
            policy = _Recorder(client)
            events = []
            for i, task in enumerate(sim_tasks("train", 3, ["take_photo", "alarm_on"])):
                episode = run_episode(
                    SimEnv(), task, policy, "choice", episode_id=f"ids-{i}", prompter=Prompter(tokenizer)
                )
                outcome = await episode
                events.append(
                    outcome.to_event(run=cfg.run, collector_id="c", mode="choice", base_model=cfg.model.base_model_id)
                )
            return events, policy.results

    events, results = asyncio.run(collect())
    with Producer(cfg.kafka) as producer:
        for event in events:
            producer.produce_event(topics.trajectories, event)
    messages = read_topic(cfg.kafka, topics.trajectories)
    # Sorted as acted (ids-0, ids-1, ...): partitions interleave the episodes.
    read = sorted((decode(m.value(), expect=TrajectoryEvent) for m in messages), key=lambda e: e.episode_id)
    # On the log: every step's prompt as the server tokenised it, two bytes a token.
    steps = [step for event in read for step in event.steps]
    assert len(steps) == len(results) > 0
    for step, result in zip(steps, results, strict=True):
        assert step.prompt_token_ids is not None and step.prompt_token_ids.dtype == "uint16"
        assert step.prompt_token_ids.to_numpy().tolist() == list(result.prompt_token_ids)

    # A learner whose own chat template differs from the collectors' (another version of the tokenizer files).
    model, learner_tokenizer = load_policy(smollm2_server.model_dir, ModelConfig(), precision=PRECISION)
    learner_tokenizer.chat_template = "{{ 'Learner side. ' }}" + learner_tokenizer.chat_template
    learner = LearnerConfig(batch_episodes=len(read), min_buffer_episodes=1, micro_batch_steps=4)
    trainer = Trainer(learner, model, learner_tokenizer, ReplayBuffer.from_config(learner), precision=PRECISION)
    episodes = [
        episode_from_event(e, check_action=trainer.constraint.allowed, vocab_size=trainer.vocab_size) for e in read
    ]
    assert sum(trainer.check_prompt_ids(e) for e in episodes) == len(steps) == trainer.prompt_ids_mismatched
    assert [list(trainer.step_prompt(e, t).ids) for e in episodes for t in range(len(e))] == [  # type: ignore[union-attr]
        list(r.prompt_token_ids) for r in results
    ]
    for episode in episodes:
        trainer.buffer.add(episode)
    trainer.mark_version(0)
    stats = trainer.update("aride", version=0)
    # The update scored the server's prompts: log π of the base model is the served log μ, to bf16's rounding.
    assert stats is not None and stats["logp_mismatch_steps"] > 0  # the steps DPER drew (with replacement)
    mean, worst = stats["logp_mismatch_mean"], stats["logp_mismatch_max"]
    print(f"SmolLM2 bf16 learner vs bf16 vLLM: |log π − log μ| mean {mean:.4f}, max {worst:.4f} nats")
    assert mean < MAX_MEAN_GAP
