#!/usr/bin/env bash
# GPU check of the policy side (issue 5) on a machine with a CUDA GPU and this repository, without network access.
#
# It builds a ~0.5B Qwen2-architecture policy locally (random init, our byte-level BPE tokenizer; no hub download),
# then measures, with transformers on the GPU:
#   - learner-side log-prob agreement, bf16 vs fp32, of the same weights, on actions sampled in free mode and (when
#     xgrammar is importable) in choice mode, with and without a LoRA adapter: the gap a bf16 vLLM server and an
#     fp32 learner would show, at a realistic model size;
#   - transformers throughput: per-request generate (one action per call), batched generate, and the learner's
#     log-prob forward+backward with a LoRA adapter.
# Results: JSON on stdout and in $OUT/gpu_check.json when $OUT is set.
#
# The regular vllm package is not installed there and cannot be: no package registry is reachable and its wheels
# exceed what can be carried. So the server-side checks (serving, sampling through vLLM, LoRA hot-load) are not part
# of this script and are reported as skipped; where `import vllm` works, run them with `pytest tests/inference`.
# xgrammar is not in that image either: the choice-mode measurement runs only where it is importable (it can be
# carried as a wheel).
#
# Usage: scripts/gpu_check.sh            (PYTHON=python3 by default)
#        scripts/gpu_check.sh --smoke    (CPU, a small model: checks the script itself in seconds)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
if [ "$SMOKE" = 0 ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L; }; then
    echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed); run with --smoke to check the script on CPU" >&2
    exit 1
fi
if "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: vllm is importable: run the server-side checks with pytest tests/inference" >&2
else
    echo "gpu_check: vllm is not importable here (no registry access to install it; its wheels are too large to" \
        "carry): skipping the server-side checks, measuring the learner side with transformers only" >&2
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GPU_CHECK_SMOKE=$SMOKE
exec "$PY" - "${OUT:-}" <<'PYEOF'
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from distrl_stream.policy.logprobs import action_logprobs
from distrl_stream.policy.model import ModelSpec, build_model, count_parameters
from distrl_stream.policy.prompt import build_prompt

out_dir = sys.argv[1]
smoke = os.environ["GPU_CHECK_SMOKE"] == "1"
device = "cpu" if smoke else "cuda"
has_vllm = importlib.util.find_spec("vllm") is not None
has_xgrammar = importlib.util.find_spec("xgrammar") is not None
N = 8 if smoke else 64  # sampled actions per mode
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
result: dict = {
    "name": "gpu_check",
    "smoke": smoke,
    "python": platform.python_version(),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
    "vllm_available": has_vllm,
    "xgrammar_available": has_xgrammar,
    "skipped": ["vllm server: serve, sampling through vLLM, LoRA hot-load (" + (
        "vllm importable: run pytest tests/inference" if has_vllm else "vllm not installed") + ")"],
}
if not has_xgrammar:
    result["skipped"].append("choice mode (xgrammar not installed)")


def log(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr)


def workload(n: int) -> tuple[list, str]:
    """(prompt, candidates) pairs from the simulated phone, or a built-in stand-in when its imports are missing."""
    try:
        import asyncio

        from distrl_stream.envs.sim import SimEnv, sim_tasks

        async def collect() -> list:
            env, cases = SimEnv(), []
            for task in sim_tasks("train", n):
                obs = await env.reset(task)
                cases.append((build_prompt(obs.instruction, obs.screen, []), env.candidates(obs)))
            return cases

        return asyncio.run(collect()), "sim"
    except ImportError as exc:  # the simulator needs pydantic, which a bare GPU image may lack
        log(f"simulator unavailable ({exc}); using built-in screens")
        cases = []
        for i in range(n):
            labels = [f"Item {i * 7 + j}" for j in range(5)]
            screen = "Settings\n" + "\n".join(f"[{j}] button {label}" for j, label in enumerate(labels))
            cands = [f'{{"action_type":"click","index":{j}}}' for j in range(5)] + ['{"action_type":"navigate_back"}']
            cases.append((build_prompt(f"Open {labels[i % 5]}", screen, []), cands))
        return cases, "builtin"


def corpus_or_none(cases: list) -> list | None:
    """None (build_model's default corpus, from the simulator) when the simulator imports, else the cases' texts."""
    try:
        import distrl_stream.envs.sim  # noqa: F401
    except ImportError:
        return [p for p, _ in cases] + [c for _, cands in cases for c in cands]
    return None


cases, source = workload(N)
result["workload"] = source
tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
# Qwen2.5-0.5B's layer shapes (hidden 896, 14 heads of 64, 2 KV heads, MLP 4864) with our 4k-token vocabulary;
# 32 layers instead of 24 bring it to ~0.5B parameters (the real one spends 136M of its 494M on a 152k vocabulary).
spec = (
    ModelSpec(vocab_size=1024, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)
    if smoke
    else ModelSpec(
        vocab_size=4096, hidden_size=896, num_layers=32, num_heads=14, num_kv_heads=2, intermediate_size=4864,
        max_positions=2048,
    )
)
started = time.perf_counter()
model_dir = build_model(tmp / "policy", spec, corpus=corpus_or_none(cases))
result["build_s"] = time.perf_counter() - started
result["params"] = count_parameters(model_dir)
log(f"built {result['params']:,} parameters in {result['build_s']:.0f}s")

tokenizer = AutoTokenizer.from_pretrained(model_dir)
fp32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
bf16 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
eos = tokenizer.eos_token_id


def sample(model: torch.nn.Module, mode: str, batch: list) -> list[list[int]]:
    """Sample one action per case with generate (temperature 1, no top-p/top-k), as the server would."""
    prompts = [p for p, _ in batch]
    kwargs = {}
    max_new = 24
    if mode == "choice":
        import xgrammar as xgr

        from distrl_stream.policy.logprobs import choice_grammar

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
        compiler = xgr.GrammarCompiler(info)
        grammars = [compiler.compile_grammar(choice_grammar(c)) for _, c in batch]
        kwargs["logits_processor"] = [xgr.contrib.hf.LogitsProcessor(grammars)]
        max_new = max(len(c.encode()) for _, cands in batch for c in cands) + 1
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
            pad_token_id=eos, **kwargs,
        )
    actions = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        actions.append(row[: row.index(eos) + 1] if eos in row else row)
    return actions


def gaps(model_a: torch.nn.Module, model_b: torch.nn.Module, mode: str, actions: list[list[int]]) -> dict:
    prompts = [p for p, _ in cases]
    cands = [c for _, c in cases] if mode == "choice" else None
    with torch.no_grad():
        a = action_logprobs(model_a, tokenizer, prompts, actions, cands).logprob.float().cpu()
        b = action_logprobs(model_b, tokenizer, prompts, actions, cands).logprob.float().cpu()
    diff = (a - b).abs().tolist()
    return {"mean_abs_gap_nats": statistics.fmean(diff), "max_abs_gap_nats": max(diff), "mean_logprob": a.mean().item()}


def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """A rank-8 adapter with non-zero A and B (as after training); the same values whatever the base dtype."""
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS))
    params = [p for name, p in lora.named_parameters() if "lora_" in name]
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.02)
    return lora.eval()


modes = ["free"] + (["choice"] if has_xgrammar else [])
agreement = {}
for mode in modes:
    actions = sample(fp32, mode, cases)
    agreement[mode] = gaps(fp32, bf16, mode, actions)
    log(f"{mode}: bf16 vs fp32 {agreement[mode]}")
fp32_lora, bf16_lora = with_lora(fp32), with_lora(bf16)
actions = sample(fp32_lora, "free", cases)
agreement["free_lora"] = gaps(fp32_lora, bf16_lora, "free", actions)
log(f"free + LoRA: bf16 vs fp32 {agreement['free_lora']}")
result["bf16_vs_fp32"] = agreement
fp32_lora, fp32 = None, None
if device == "cuda":
    torch.cuda.empty_cache()


def timed(fn, repeat: int) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeat


mode = modes[-1]
sample(bf16_lora, mode, cases[:2])  # warm-up
per_request = timed(lambda: [sample(bf16_lora, mode, [c]) for c in cases[:8]], 1) / 8
batched = timed(lambda: sample(bf16_lora, mode, cases[:32]), 2) / len(cases[:32])
prompts, cands = [p for p, _ in cases[:32]], [c for _, c in cases[:32]]
train_actions = sample(bf16_lora, mode, cases[:32])
bf16_lora.train()


def learner_step() -> None:
    out = action_logprobs(bf16_lora, tokenizer, prompts, train_actions, cands if mode == "choice" else None)
    (-(out.logprob.float().mean()) - 0.01 * out.entropy.float().sum() / out.mask.sum()).backward()
    bf16_lora.zero_grad(set_to_none=True)


learner_step()
step_s = timed(learner_step, 3)
result["throughput"] = {
    "mode": mode,
    "dtype": "bfloat16",
    "per_request_generate_actions_per_s": 1 / per_request,
    "batched32_generate_actions_per_s": 1 / batched,
    "learner_logprob_fwd_bwd_samples_per_s": len(prompts) / step_s,
}
if device == "cuda":
    result["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
log(f"throughput {result['throughput']}")

text = json.dumps(result, indent=2)
print(text)
if out_dir:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "gpu_check.json").write_text(text + "\n")
PYEOF
