"""Learner-side log π(a|s): exact choice masks, padding-invariant batches, gradients.

Agreement with the server's log-probs is tested against a real server in tests/inference.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from distrl_stream.errors import ActionConstraintError
from distrl_stream.policy.logprobs import ChoiceConstraint, action_logprobs, choice_grammar
from distrl_stream.policy.prompt import build_prompt

CANDIDATES = [
    '{"action_type":"click","index":3}',
    '{"action_type":"click","index":31}',
    '{"action_type":"navigate_back"}',
    '{"action_type":"type","text":"café ☃ \\"quoted\\"","index":0}',
    "click",  # a candidate that is a prefix of another: the stop token and a continuation are both allowed
    "click more",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@cache
def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable-character map, which byte-level BPE vocabularies are written in.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _vocab_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes | None]:
    special = set(tokenizer.all_special_ids)
    decoder = _byte_decoder()
    return [
        None if i in special else bytes(decoder[c] for c in tokenizer.convert_ids_to_tokens(i))
        for i in range(len(tokenizer))
    ]


def _random_tokenization(target: bytes, vocab: list[bytes | None], rng: random.Random) -> list[int]:
    ids: list[int] = []
    pos = 0
    while pos < len(target):
        fits = [i for i, b in enumerate(vocab) if b and target.startswith(b, pos)]
        ids.append(rng.choice(fits))
        pos += len(vocab[ids[-1]] or b"")
    return ids


def _trie_allowed(prefix: bytes, vocab: list[bytes | None], eos: int) -> set[int]:
    encoded = [c.encode() for c in CANDIDATES]
    allowed = {i for i, b in enumerate(vocab) if b and any(c.startswith(prefix + b) for c in encoded)}
    return allowed | ({eos} if prefix in encoded else set())


def test_choice_masks_equal_a_byte_trie_over_the_candidates_for_any_tokenisation(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module
) -> None:
    vocab = _vocab_bytes(tokenizer)
    constraint = ChoiceConstraint(tokenizer, model.config.vocab_size)
    rng = random.Random(0)
    checked = 0
    for candidate in CANDIDATES:
        for _ in range(4):
            ids = [*_random_tokenization(candidate.encode(), vocab, rng), tokenizer.eos_token_id]
            masks = constraint.allowed(CANDIDATES, ids)
            prefix = b""
            for pos, token in enumerate(ids):
                expected = _trie_allowed(prefix, vocab, tokenizer.eos_token_id)
                assert set(masks[pos].nonzero().flatten().tolist()) == expected, (candidate, pos)
                prefix += vocab[token] or b""
                checked += 1
    assert checked > 100


def test_choice_grammar_escapes_like_vllm() -> None:
    assert choice_grammar(['a"b', "c\\d\n"]) == 'root ::= "a\\"b" | "c\\\\d\\n"'


def test_token_outside_the_choice_is_a_typed_error(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> None:
    constraint = ChoiceConstraint(tokenizer, model.config.vocab_size)
    wrong = tokenizer('{"action_type":"wait"}')["input_ids"]
    with pytest.raises(ActionConstraintError, match="not allowed"):
        constraint.allowed(CANDIDATES[:3], wrong)


def _prompts(n: int) -> list[str]:
    return [build_prompt(f"task {i}", "[0] button OK\n" * (1 + i % 4), CANDIDATES[: i % 3]) for i in range(n)]


def test_forced_tokens_have_log_prob_zero_and_zero_entropy(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module
) -> None:
    ids = [*tokenizer(CANDIDATES[2])["input_ids"], tokenizer.eos_token_id]
    out = action_logprobs(model, tokenizer, _prompts(1), [ids], [CANDIDATES])
    allowed = ChoiceConstraint(tokenizer, model.config.vocab_size).allowed(CANDIDATES, ids)
    forced = allowed.sum(-1) == 1
    assert forced.any() and (~forced).any()
    assert torch.all(out.token_logprobs[0][forced] == 0)
    assert torch.all(out.entropy[0][forced].abs() < 1e-6)
    assert torch.all(out.entropy[0][~forced] > 0)
    assert torch.all(out.token_logprobs[0][~forced] < 0)


def test_free_mode_is_the_plain_log_softmax_at_the_sampling_temperature(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module
) -> None:
    prompt = _prompts(1)[0]
    action = tokenizer("anything at all")["input_ids"]
    out = action_logprobs(model, tokenizer, [prompt], [action], temperature=2.0)
    full = torch.tensor([tokenizer(prompt)["input_ids"] + action])
    with torch.no_grad():
        logits = model(full).logits[0, -len(action) - 1 : -1] / 2.0
    logp = torch.log_softmax(logits, -1)
    expected = logp.gather(-1, torch.tensor(action).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.token_logprobs[0], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy[0], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logprob[0], expected.sum(), atol=1e-5, rtol=0)


def test_a_padded_mixed_batch_equals_one_sample_at_a_time(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module
) -> None:
    prompts = _prompts(4)
    eos = tokenizer.eos_token_id
    actions = [
        [*tokenizer(CANDIDATES[i % 3])["input_ids"], eos] if i % 2 == 0 else tokenizer("x y")["input_ids"]
        for i in range(4)
    ]
    candidates = [CANDIDATES if i % 2 == 0 else None for i in range(4)]
    batch = action_logprobs(model, tokenizer, prompts, actions, candidates)
    assert batch.mask.sum(-1).tolist() == [len(a) for a in actions]
    for i in range(4):
        one = action_logprobs(model, tokenizer, [prompts[i]], [actions[i]], [candidates[i]])
        n = len(actions[i])
        torch.testing.assert_close(batch.token_logprobs[i, :n], one.token_logprobs[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batch.entropy[i, :n], one.entropy[0], atol=1e-5, rtol=0)
        assert torch.all(batch.token_logprobs[i, n:] == 0)


def test_gradients_reach_the_lora_weights(tokenizer: PreTrainedTokenizerBase, tiny_model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    ids = [*tokenizer(CANDIDATES[0])["input_ids"], tokenizer.eos_token_id]
    out = action_logprobs(lora, tokenizer, _prompts(1), [ids], [CANDIDATES])
    (out.logprob.sum() + out.entropy.sum()).backward()
    grads = [p.grad for n, p in lora.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def _dense_reference(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompt: str, action: list[int], cands: list[str] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π and entropy the slow way: the model's own full logits, the grammar's vocabulary mask."""
    full = torch.tensor([tokenizer(prompt)["input_ids"] + action])
    with torch.no_grad():
        logits = model(full).logits[0, -len(action) - 1 : -1, : model.config.vocab_size].float()
    if cands is not None:
        allowed = ChoiceConstraint(tokenizer, model.config.vocab_size).allowed(cands, action)
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(logits, -1)
    finite = torch.where(torch.isfinite(logp), logp, torch.zeros(()))
    return logp.gather(-1, torch.tensor(action).unsqueeze(-1)).squeeze(-1), -(logp.exp() * finite).sum(-1)


def _mixed_batch_matches_the_dense_reference(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
    prompts = _prompts(5)
    stop = tokenizer.eos_token_id
    actions = [
        [*tokenizer(CANDIDATES[i % 4], add_special_tokens=False)["input_ids"], stop]
        if i != 3
        else tokenizer("x y", add_special_tokens=False)["input_ids"]
        for i in range(5)
    ]
    candidates = [None if i == 3 else CANDIDATES for i in range(5)]
    with torch.no_grad():
        batch = action_logprobs(model, tokenizer, prompts, actions, candidates)
    for i in range(5):
        lp, ent = _dense_reference(model, tokenizer, prompts[i], actions[i], candidates[i])
        n = len(actions[i])
        torch.testing.assert_close(batch.token_logprobs[i, :n], lp, atol=2e-4, rtol=0)
        torch.testing.assert_close(batch.entropy[i, :n], ent, atol=2e-4, rtol=0)


def test_only_the_allowed_tokens_logits_give_the_dense_masked_log_softmax(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module
) -> None:
    _mixed_batch_matches_the_dense_reference(model, tokenizer)


def test_a_real_pretrained_model_gives_the_dense_masked_log_softmax(smollm2_dir: Path) -> None:
    # 49,152 tokens, a Llama decoder and a tied output head: the gather path must hold beyond the tiny Qwen2.
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    _mixed_batch_matches_the_dense_reference(model, tokenizer)
