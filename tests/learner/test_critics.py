"""Critic heads on feature tensors, and prompt features from a real (tiny, randomly initialised) Qwen2 model."""

from __future__ import annotations

import pytest
import torch

from distrl_stream.learner import aride, critics
from distrl_stream.learner.critics import StepCritic, TrajectoryCritic, ValueHead, prompt_features
from distrl_stream.policy.logprobs import PackedRows, use_shared_prefix_attention

torch.set_num_threads(1)

PROMPTS = [
    "Turn on Wi-Fi. Screen: [1] Settings [2] Wi-Fi off",
    "Open Clock",
    "Search for cats. Screen: [1] search box [2] Search button [3] Back",
]


@pytest.fixture(scope="module")
def tiny_lm() -> tuple[object, object]:
    """A real Qwen2 causal LM (random weights, head_dim 64) and a byte-level BPE tokenizer trained on the prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        PROMPTS, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM(config), tokenizer


def test_value_heads_output_probabilities_per_feature_row() -> None:
    head = ValueHead(feature_dim=16, hidden_dim=8)
    v = head.value(torch.randn(5, 16) * 100)
    assert v.shape == (5,) and bool(((v >= 0) & (v <= 1)).all())


def test_step_critic_learns_retrace_targets_from_features() -> None:
    torch.manual_seed(0)
    critic = StepCritic(feature_dim=8, hidden_dim=32)
    features = torch.randn(2, 3, 8)  # [B, T, D]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    targets = torch.tensor([[0.25, 0.5, 1.0], [0.1, 0.0, 0.0]])
    opt = torch.optim.Adam(critic.parameters(), lr=2e-2)
    losses = []
    for _ in range(150):
        logits = aride.pad_steps(critic(features[mask]), mask)  # flat steps -> [B, T]
        loss = aride.critic_loss(logits, targets, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        v = critic.value(features[mask])
    assert losses[-1] < losses[0]
    assert v.tolist() == pytest.approx(targets[mask].tolist(), abs=0.05)


def test_trajectory_critic_learns_success_probability_by_bce() -> None:
    torch.manual_seed(0)
    critic = TrajectoryCritic(feature_dim=4, hidden_dim=16)
    easy, hard = torch.randn(32, 4) + 2.0, torch.randn(32, 4) - 2.0
    features = torch.cat([easy, hard])
    success = torch.cat([torch.ones(32), torch.zeros(32)]).bool()
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for _ in range(100):
        opt.zero_grad()
        critic.loss(features, success).backward()
        opt.step()
    with torch.no_grad():
        assert critic.value(easy).mean() > 0.9 and critic.value(hard).mean() < 0.1


def test_prompt_features_are_the_last_token_hidden_state_whatever_the_batch(tiny_lm: tuple) -> None:
    model, tokenizer = tiny_lm
    model.train()
    batched = prompt_features(model, tokenizer, PROMPTS, batch_size=3)
    assert batched.shape == (3, 64) and not batched.requires_grad
    assert model.training  # the caller's mode is restored
    for i, prompt in enumerate(PROMPTS):
        alone = prompt_features(model, tokenizer, [prompt])
        assert torch.allclose(alone[0], batched[i], atol=1e-5)
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            expected = model.eval()(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
        assert torch.allclose(batched[i], expected, atol=1e-5)
    assert not torch.allclose(batched[0], batched[1])


def test_prompt_features_come_from_the_frozen_base_not_the_lora_adapter(tiny_lm: tuple) -> None:
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_lm
    base = prompt_features(model, tokenizer, PROMPTS)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    try:
        with torch.no_grad():
            adapted = peft_model(
                input_ids=torch.tensor([tokenizer(PROMPTS[0])["input_ids"]]), output_hidden_states=True
            )
        assert not torch.allclose(adapted.hidden_states[-1][0, -1], base[0], atol=1e-4)  # the adapter does change it
        assert torch.allclose(prompt_features(peft_model, tokenizer, PROMPTS), base, atol=1e-5)
    finally:
        peft_model.unload()


def test_packed_prompt_features_are_the_unpacked_ones(tiny_lm: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = tiny_lm
    assert use_shared_prefix_attention(model) is None
    shared = f"{PROMPTS[2]} {PROMPTS[0]}"  # a long common start
    prompts = [f"{shared} [4] OK", f"{shared} [4] Cancel [5] Help", PROMPTS[1], shared]
    packed_rows: list[int] = []
    run = critics.packed_decoder_states

    def counted(model: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
        packed_rows.append(len(packed.action_index))
        return run(model, packed)

    monkeypatch.setattr(critics, "packed_decoder_states", counted)
    packed = prompt_features(model, tokenizer, prompts, shared_prefix_tokens=16)
    assert packed_rows == [4]
    assert torch.allclose(packed, prompt_features(model, tokenizer, prompts), atol=1e-5)
