"""Learner-side log π(a|s): exact choice masks, padding-invariant batches, gradients.

Agreement with the server's log-probs is tested against a real server in tests/inference.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from distrl_stream.errors import ActionConstraintError, LearnerError
from distrl_stream.policy.logprobs import (
    ActionLogProbs,
    ChoiceConstraint,
    action_logprobs,
    choice_grammar,
    pack_rows,
    shared_prefix_groups,
    use_shared_prefix_attention,
)
from distrl_stream.policy.precision import autocast
from distrl_stream.policy.prompt import Prompter, build_prompt
from tests.fixtures.packing import count_packed_passes

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


# -- packed passes: each shared prompt prefix computed once ------------------------------------------------------------


def test_rows_are_grouped_around_the_longest_prefixes_worth_sharing() -> None:
    a = list(range(100, 130))  # 30 tokens two "episodes" share, then each its own
    rows = [
        [*a, 1, 2, 3, 4],
        [*a, 1, 2, 3, 5],
        [*a, 9, 9],
        list(range(40)),  # shares nothing
        [*a, 1, 2],  # the whole of it is shared with rows 0 and 1: its last token stays its own
    ]
    # Rows 0, 1, 4 share 32 tokens, 31 of them shareable (row 4 keeps its last), and row 2 30 with them: one group
    # of all four saves 3 × 30 = 90 tokens, rows 0, 1, 4 alone 2 × 31 = 62. Groups come in the prompts' sorted order.
    assert shared_prefix_groups(rows, 16) == [(0, [3]), (30, [0, 1, 2, 4])]
    assert shared_prefix_groups(rows, 31) == [(0, [3]), (31, [0, 1, 4]), (0, [2])]
    assert shared_prefix_groups(rows, 34) == [(0, [i]) for i in (3, 4, 0, 1, 2)]
    assert shared_prefix_groups([[5]], 1) == [(0, [0])]


def test_each_packed_token_sees_its_own_row_causally_and_nothing_else() -> None:
    prompts = [[7, 8, 9, 1], [7, 8, 9, 2, 2], [4, 4]]
    actions = [[10, 11], [12], []]
    packed = pack_rows(prompts, actions, [(3, [0, 1]), (0, [2])], width_a=2)
    layout = packed.layout
    seen: dict[int, set[int]] = {}  # position -> the positions its query reads
    offset = 0
    for index in layout.rows:
        for row, positions in enumerate(index.tolist()):
            for column, position in enumerate(positions):
                if int(layout.unpack[position]) == offset + row * index.shape[1] + column:  # its own row
                    seen[position] = set(positions[: column + 1])  # causal attention over the row
        offset += index.numel()
    tokens = packed.input_ids[0].tolist()
    assert tokens == [7, 8, 9, 1, 10, 11, 2, 2, 12, 4, 4]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1]
    prefix = {0, 1, 2}
    expected = {0: {0}, 1: {0, 1}, 2: prefix}
    expected |= {p: prefix | set(range(3, p + 1)) for p in range(3, 6)}  # row 0: prefix, then itself causally
    expected |= {p: prefix | set(range(6, p + 1)) for p in range(6, 9)}  # row 1: never row 0
    expected |= {9: {9}, 10: {9, 10}}  # row 2: a group of its own
    assert seen == expected
    # The hidden state before each action token: the row's last prompt token, then its action's (padding repeats).
    assert packed.action_index.tolist() == [[3, 4], [7, 7], [10, 10]]


def _lora_policy(model_dir: Path) -> torch.nn.Module:
    """The model with a LoRA adapter whose B is not 0 (so that A has a gradient too), on shared-prefix attention."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    model = get_peft_model(base, config)
    assert use_shared_prefix_attention(model) is None
    return model


def _episode_rows(tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], list[list[int]], list[list[str] | None]]:
    """Steps of one episode (the same task, screens that begin alike), a step of another, in choice and free mode."""
    prompter = Prompter(tokenizer)
    home = "[0] app Clock\n[1] app Contacts\n[2] app Store\n[3] app Notes\n"
    screens = [home + "[4] text Wi-Fi off", home + "[4] toggle Bluetooth on\n[5] button OK", home, "[0] button Back"]
    prompts = [
        prompter("Turn on Bluetooth", screen, CANDIDATES[:t], CANDIDATES[:3]) for t, screen in enumerate(screens[:3])
    ]
    prompts += [prompter("Open the notes", screens[3], [], CANDIDATES[:3]), prompter("Turn on Bluetooth", home)]
    stop = tokenizer.eos_token_id
    actions = [[*tokenizer(CANDIDATES[i % 3], add_special_tokens=False)["input_ids"], stop] for i in range(4)]
    actions.append(tokenizer("x y", add_special_tokens=False)["input_ids"])
    return prompts, actions, [CANDIDATES[:3]] * 4 + [None]


def _with_gradients(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    rows: tuple[list[str], list[list[int]], list[Any]],
    packed: bool,
) -> tuple[ActionLogProbs, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = action_logprobs(model, tokenizer, *rows, shared_prefix_tokens=16 if packed else 0)
    (out.logprob.sum() + out.entropy.sum()).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.requires_grad]


def _packed_equals_unpacked(model_dir: Path, monkeypatch: pytest.MonkeyPatch, atol: float) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = _lora_policy(model_dir)
    rows = _episode_rows(tokenizer)
    packed_passes = count_packed_passes(monkeypatch)
    unpacked, unpacked_grads = _with_gradients(model, tokenizer, rows, packed=False)
    assert not packed_passes
    packed, packed_grads = _with_gradients(model, tokenizer, rows, packed=True)
    assert len(packed_passes) == 1 and packed_passes[0] < sum(
        len(tokenizer(p)["input_ids"]) + len(a) for p, a in zip(rows[0], rows[1], strict=True)
    )
    assert torch.equal(packed.mask, unpacked.mask)
    torch.testing.assert_close(packed.token_logprobs, unpacked.token_logprobs, atol=atol, rtol=0)
    torch.testing.assert_close(packed.entropy, unpacked.entropy, atol=atol, rtol=0)
    assert all(g.abs().sum() > 0 for g in unpacked_grads)
    for a, b in zip(unpacked_grads, packed_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=atol * float(a.abs().max()))


def test_a_packed_pass_gives_the_unpacked_log_pi_entropy_and_gradient(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _packed_equals_unpacked(tiny_model_dir, monkeypatch, atol=1e-5)


def test_a_packed_pass_of_a_real_pretrained_model_gives_the_unpacked_log_pi_and_gradient(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SmolLM2's chat prompts: the system message and the task are the shared prefix; Llama's GQA attention.
    _packed_equals_unpacked(smollm2_dir, monkeypatch, atol=1e-4)


def test_a_packed_row_sees_nothing_of_the_other_rows(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = _lora_policy(tiny_model_dir)
    prompts, actions, candidates = _episode_rows(tokenizer)
    packed_passes = count_packed_passes(monkeypatch)
    with torch.no_grad():
        before = action_logprobs(model, tokenizer, prompts, actions, candidates, shared_prefix_tokens=16)
        # Row 1, packed between rows 0 and 2 of its group: another screen after the shared prefix.
        prompts[1] = prompts[1].replace("toggle Bluetooth on", "slider Volume 3 of 10 and a longer line")
        after = action_logprobs(model, tokenizer, prompts, actions, candidates, shared_prefix_tokens=16)
    assert len(packed_passes) == 2
    assert float((after.token_logprobs[1] - before.token_logprobs[1]).abs().max()) > 1e-3
    others = [0, 2, 3, 4]
    torch.testing.assert_close(after.token_logprobs[others], before.token_logprobs[others], atol=1e-6, rtol=0)
    torch.testing.assert_close(after.entropy[others], before.entropy[others], atol=1e-6, rtol=0)


def test_a_packed_pass_under_bf16_autocast_stays_near_the_unpacked_one(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = _lora_policy(tiny_model_dir)
    rows = _episode_rows(tokenizer)
    with torch.no_grad(), autocast(torch.device("cpu"), "bfloat16"):
        packed = action_logprobs(model, tokenizer, *rows, shared_prefix_tokens=16).logprob
        unpacked = action_logprobs(model, tokenizer, *rows).logprob
    with torch.no_grad():
        full = action_logprobs(model, tokenizer, *rows).logprob
    # Both within bf16's own distance from float32: packing adds no error of its own.
    bf16_gap = float((unpacked - full).abs().max())
    assert 0 < bf16_gap < 0.1
    assert float((packed - unpacked).abs().max()) <= 2 * bf16_gap


def test_a_packed_pass_needs_the_shared_prefix_attention(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(LearnerError, match="0 of the policy's 2 attention layers"):
        action_logprobs(model, tokenizer, *_episode_rows(tokenizer), shared_prefix_tokens=16)
