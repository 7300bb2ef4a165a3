"""Learner-side log π(a|s): the log-probability the current weights give to the tokens the server sampled.

Both modes reproduce what the vLLM server computed for the behaviour policy (``--logprobs-mode
processed_logprobs``: log-softmax of the logits after temperature and after the structured-output mask):

- **free mode**: log-softmax(logits / temperature) over the whole vocabulary;
- **choice mode**: the same, with every token the server's grammar forbade masked out. vLLM turns
  ``structured_outputs.choice`` into the xgrammar grammar ``root ::= "c1" | "c2" | ...``; we compile the same
  grammar with the same engine, so the allowed set at each position is exactly the server's: every token whose
  bytes keep the text a prefix of some candidate (any tokenisation, not only the canonical one), plus the stop
  token once the text equals a whole candidate.

Everything is differentiable with respect to the model's parameters; the learner backpropagates through it.

A vision policy's prompts are :class:`~distrl_stream.policy.prompt.ImagePrompt`: its processor (in place of the
tokenizer) encodes the text with the image placeholder expanded as the server expands it, and the image's pixels
enter the forward pass, so log π(a | image, text) is what the server computed (docs/design.md §6.1).

Rows whose prompts begin with the same tokens (an episode's steps: system message and task) can be packed into one
sequence where that prefix is computed once (:func:`shared_prefix_groups`, :class:`PrefixLayout`): every row attends
to exactly what it attends to alone, so log π and its gradient are the same, for fewer tokens (docs/learner.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedTokenizerBase, ProcessorMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from distrl_stream.errors import ActionConstraintError, LearnerError
from distrl_stream.policy.prompt import ImagePrompt, ModelPrompt, TokenPrompt
from distrl_stream.policy.vision import decode_png

# What encodes a policy's prompts: its tokenizer, or a vision policy's processor (which holds the tokenizer).
Encoder = PreTrainedTokenizerBase | ProcessorMixin

_EBNF_ESCAPES = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}


def choice_grammar(candidates: Sequence[str]) -> str:
    """The EBNF grammar vLLM builds for ``structured_outputs.choice`` (vllm ``choice_as_grammar``, same escaping)."""

    def escape(ch: str) -> str:
        if ch in _EBNF_ESCAPES:
            return _EBNF_ESCAPES[ch]
        return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch

    return "root ::= " + " | ".join('"' + "".join(escape(ch) for ch in c) + '"' for c in candidates)


class ChoiceConstraint:
    """Per-position allowed-token masks of a choice among candidate strings, computed with xgrammar.

    Build one per (tokenizer, model) and reuse it: compiled grammars are cached per candidate list.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: Sequence[int] | None = None
    ) -> None:
        """Args:
        tokenizer: the policy's tokenizer.
        vocab_size: the model's vocabulary size (``model.config.vocab_size``; may exceed the tokenizer's).
        stop_token_ids: tokens that end a completed choice; default: what xgrammar detects (the eos token),
            as vLLM does.
        """
        # Imported here: free mode (and a learner without choice mode) needs no xgrammar.
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) if stop_token_ids else None
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self._compile = lru_cache(maxsize=4096)(self._compile_uncached)
        # Bit j of 32-bit word k of xgrammar's bitmask allows token 32*k + j.
        self._bits = torch.arange(32, dtype=torch.int32)

    def _compile_uncached(self, candidates: tuple[str, ...]) -> Any:
        return self._compiler.compile_grammar(choice_grammar(candidates))

    def allowed(self, candidates: Sequence[str], token_ids: Sequence[int]) -> Tensor:
        """Allowed tokens before each of ``token_ids``, as the server's grammar saw them.

        Returns:
            Bool tensor [len(token_ids), vocab_size]; row i is the set the i-th token was drawn from.

        Raises:
            ActionConstraintError: a token the grammar forbids (the tokens were not generated under this choice).
        """
        if not candidates:
            raise ActionConstraintError("choice mode needs at least one candidate")
        matcher = self._xgr.GrammarMatcher(self._compile(tuple(candidates)))
        bitmask = self._xgr.allocate_token_bitmask(max(len(token_ids), 1), self.vocab_size)
        for i, token in enumerate(token_ids):
            matcher.fill_next_token_bitmask(bitmask, i)
            if not matcher.accept_token(int(token)):
                raise ActionConstraintError(
                    f"token {token} at position {i} is not allowed by the choice among {len(candidates)} candidates"
                )
        bits = (bitmask[: len(token_ids)].unsqueeze(-1) >> self._bits) & 1
        return bits.reshape(len(token_ids), -1)[:, : self.vocab_size].bool()


@dataclass(frozen=True)
class ActionLogProbs:
    """Per-token log-probabilities of a batch of actions, right-padded to the longest action.

    Attributes:
        token_logprobs: [B, T] log π of each action token (0 at padding).
        entropy: [B, T] entropy of π at each action position, over the allowed tokens in choice mode (0 at padding).
        mask: [B, T] True at real action tokens.
    """

    token_logprobs: Tensor
    entropy: Tensor
    mask: Tensor

    @property
    def logprob(self) -> Tensor:
        """[B] log π(a|s) of each whole action: the sum over its tokens."""
        return self.token_logprobs.sum(-1)


def text_tokenizer(encoder: Encoder) -> PreTrainedTokenizerBase:
    """The tokenizer of a tokenizer or of a processor."""
    return getattr(encoder, "tokenizer", encoder)


def text_config(model: torch.nn.Module) -> Any:
    """The language model's config (vocabulary and hidden sizes), of a causal LM or of a vision-language model."""
    return model.config.get_text_config()


@dataclass(frozen=True)
class EncodedPrompts:
    """A batch of prompts as token ids, with the pixel inputs of its images.

    Attributes:
        input_ids: each prompt's token ids, as the server tokenised it (image placeholders expanded).
        images: the processor's pixel tensors (``pixel_values``, ...) of the batch's images, in prompt order,
            one image per :class:`ImagePrompt`; empty when no prompt has one.
    """

    input_ids: list[list[int]]
    images: dict[str, Tensor] = field(default_factory=dict)

    def images_to(self, device: torch.device) -> dict[str, Tensor]:
        """The pixel inputs on ``device``."""
        return {k: v.to(device) for k, v in self.images.items()}


def encode_prompts(encoder: Encoder, prompts: Sequence[ModelPrompt]) -> EncodedPrompts:
    """Token ids of each prompt, and the pixel inputs of the image prompts (concatenated over the batch: the model
    fills its image tokens with them in order). A :class:`TokenPrompt` keeps the server's ids; its image, if any, is
    encoded for its pixels only.

    Raises:
        LearnerError: a token prompt whose image tokens are not as many as its screenshot fills.
    """
    input_ids: list[list[int]] = []
    pixels: dict[str, list[Tensor]] = {}
    for prompt in prompts:
        image = prompt.image if isinstance(prompt, TokenPrompt) else prompt
        if isinstance(image, ImagePrompt):
            # As vLLM's chat endpoint: the template already holds every special token the prompt needs.
            encoded = encoder(
                text=image.text, images=[decode_png(image.png)], add_special_tokens=False, return_tensors="pt"
            )
            ids = encoded["input_ids"][0].tolist()
            if isinstance(prompt, TokenPrompt):
                check_image_tokens(encoder, prompt.ids, ids)
                ids = list(prompt.ids)
            input_ids.append(ids)
            # Everything else the processor made is the image's (pixels, and per family sizes or grids).
            for name, value in encoded.items():
                if name not in ("input_ids", "attention_mask", "token_type_ids"):
                    pixels.setdefault(name, []).append(value)
        elif isinstance(prompt, TokenPrompt):
            input_ids.append(list(prompt.ids))
        else:
            input_ids.append(text_tokenizer(encoder)(prompt)["input_ids"])
    try:
        images = {name: torch.cat(values) for name, values in pixels.items()}
    except RuntimeError as exc:  # images the processor sized differently cannot share a batch
        raise LearnerError(f"the batch's images have different processed sizes: {exc}") from None
    return EncodedPrompts(input_ids, images)


def image_token_count(encoder: Encoder, ids: Sequence[int]) -> int:
    """How many of ``ids`` are the image token a vision processor fills with pixel features (0 for a tokenizer)."""
    token = getattr(encoder, "image_token_id", None)
    if token is None and getattr(encoder, "image_token", None) is not None:
        token = text_tokenizer(encoder).convert_tokens_to_ids(encoder.image_token)
    return 0 if token is None else sum(1 for i in ids if i == token)


def check_image_tokens(encoder: Encoder, served: Sequence[int], rendered: Sequence[int]) -> None:
    """The server's ids of a vision step hold as many image tokens as its screenshot's pixels fill (``rendered``,
    the processor's encoding of the step, has exactly that many).

    Raises:
        LearnerError: they do not (the pixels could not be placed).
    """
    if image_token_count(encoder, served) != image_token_count(encoder, rendered):
        raise LearnerError(
            f"the prompt's ids hold {image_token_count(encoder, served)} image tokens, its screenshot fills "
            f"{image_token_count(encoder, rendered)}"
        )


def decoder_states(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    images: dict[str, Tensor] | None = None,
) -> Tensor:
    """The causal LM's last hidden states ``[B, L, hidden]`` (after its final norm), without the output head.

    The output head is what costs at a real vocabulary (a [B, L, V] float tensor: 1.4 GB at 150k tokens for one
    batch), and the learner needs its rows for a few tokens only. Works for a transformers causal LM and for a peft
    wrapper of one (LoRA layers are injected in place, so the decoder runs them). With ``images`` (a vision-language
    model's pixel inputs, :class:`EncodedPrompts`) the model's own multimodal body runs: it encodes the images and
    puts their features at the image tokens before the language model.
    """
    base = _causal_lm(model)
    body = base.model if images else base.get_decoder()
    out = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **(images or {}),
    )
    return out.last_hidden_state


# The policy's attention when packed passes are possible: sdpa, and prefix-aware when a pass brings a PrefixLayout.
SHARED_PREFIX_ATTENTION = "sdpa_shared_prefix"
# Rows are packed only around prefixes of at least this many tokens (chosen, not tuned): packing costs gathers around
# every attention layer, which a few shared tokens would not repay.
MIN_SHARED_PREFIX_TOKENS = 16
# A packed pass's attention rows are grouped by width in steps of this many tokens, one sdpa call per group.
ROW_WIDTH_STEP = 64


@dataclass
class PrefixLayout:
    """How the tokens of a packed sequence attend to each other.

    The sequence is cut into blocks of consecutive tokens: each group's shared prefix, and each row's own tokens (the
    rest of its prompt, its action). Attention gathers every block into a row of its own, its context (its group's
    prefix; none for a prefix) then its tokens, and runs causal sdpa over those rows: each token sees its row's
    prefix and the row's tokens before it, exactly as when the row is computed alone, and nothing of the other rows.
    Rows of about the same width share an sdpa call (a call pads its rows to its widest, and a row costs its width
    squared), so attention costs what each row's own does; a prefix's queries, recomputed in each of its rows, are
    the only work repeated.

    Attributes:
        rows: per sdpa call, ``[rows, width]`` the sequence positions of each row: its context, then its own
            tokens, then padding (position 0), which comes after every real token and so is out of their causal view.
        unpack: ``[N]`` where each position's output lies in the calls' outputs, flattened and concatenated: in its
            own block's row.
        calls: attention layers that used this layout (checked against the model's layers after a pass).
    """

    rows: tuple[Tensor, ...]
    unpack: Tensor
    calls: int = 0

    @classmethod
    def of_blocks(cls, blocks: Sequence[tuple[int, int, int, int]], length: int) -> PrefixLayout:
        """The layout of a sequence of ``length`` tokens cut into ``blocks`` of (start, length, context start,
        context length)."""
        widths = [context_n + n for _, n, _, context_n in blocks]
        calls: dict[int, list[int]] = {}
        for b, width in enumerate(widths):
            calls.setdefault(-(-width // ROW_WIDTH_STEP), []).append(b)
        rows: list[Tensor] = []
        unpack = torch.empty(length, dtype=torch.long)
        offset = 0
        for members in calls.values():
            index = torch.zeros((len(members), max(widths[b] for b in members)), dtype=torch.long)
            for row, b in enumerate(members):
                start, n, context_start, context_n = blocks[b]
                index[row, :context_n] = torch.arange(context_start, context_start + context_n)
                index[row, context_n : context_n + n] = torch.arange(start, start + n)
                unpack[start : start + n] = offset + row * index.shape[1] + context_n + torch.arange(n)
            rows.append(index)
            offset += index.numel()
        return cls(tuple(rows), unpack)

    def to(self, device: torch.device) -> PrefixLayout:
        """The layout's tensors on ``device``."""
        return PrefixLayout(tuple(index.to(device) for index in self.rows), self.unpack.to(device))

    def attend(
        self, module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, dropout: float, scaling: float | None
    ) -> Tensor:
        """Causal sdpa over the rows: ``query`` ``[1, heads, N, dim]`` and ``key``/``value`` ``[1, kv heads, N,
        dim]`` of the packed sequence give its attention output ``[1, N, heads, dim]``."""
        self.calls += 1
        outputs = []
        for index in self.rows:
            # [1, h, N, d] -> [rows, h, width, d]
            q, k, v = (
                s[0][:, index.flatten()].unflatten(1, tuple(index.shape)).transpose(0, 1) for s in (query, key, value)
            )
            out, _ = sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)
            outputs.append(out.flatten(0, 1))  # out: [rows, width, heads, dim]
        return torch.cat(outputs)[self.unpack].unsqueeze(0)


def _shared_prefix_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prefix: PrefixLayout | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' sdpa attention, or :meth:`PrefixLayout.attend` on a pass that gives a layout (a keyword argument
    of the decoder's forward, which transformers hands to every attention layer)."""
    if shared_prefix is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return shared_prefix.attend(module, query, key, value, dropout, scaling), None


# transformers' extension point for attention functions; its masks are sdpa's, so unpacked passes are sdpa's exactly.
AttentionInterface.register(SHARED_PREFIX_ATTENTION, _shared_prefix_attention)
AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)


def use_shared_prefix_attention(model: torch.nn.Module) -> str | None:
    """Give the policy the attention packed passes need (:data:`SHARED_PREFIX_ATTENTION`: sdpa for every other pass).

    Returns:
        None when it has it, else why it cannot: a vision-language model (its image features are placed by token
        position, which packing moves), an attention other than sdpa, or layers that do not attend over the whole
        sequence (a sliding window).
    """
    base = _causal_lm(model)
    config = base.config
    if config._attn_implementation == SHARED_PREFIX_ATTENTION:
        return None
    if getattr(config, "vision_config", None) is not None:
        return "the policy is a vision-language model"
    if config._attn_implementation != "sdpa":
        return f"the policy's attention is {config._attn_implementation}, not sdpa"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "the policy has layers that do not attend over the whole sequence"
    base.set_attn_implementation(SHARED_PREFIX_ATTENTION)
    if config._attn_implementation != SHARED_PREFIX_ATTENTION:
        return f"{type(base).__name__} does not take an attention function"
    return None


def shared_prefix_groups(prompt_ids: Sequence[Sequence[int]], min_tokens: int) -> list[tuple[int, list[int]]]:
    """Rows grouped around a shared leading run of prompt tokens, to compute each run once.

    Sorted, prompts that share the most are neighbours; a group is a run of them and its prefix the run's common
    prefix, short of each prompt's last token (whose hidden state predicts the row's first action token, so every
    row keeps one prompt token of its own). The runs maximise the tokens saved, Σ (rows − 1) × prefix, over prefixes
    of at least ``min_tokens`` (an exact dynamic programme over the sorted rows).

    Returns:
        (prefix length, rows) for every row's group; a row no prefix is worth sharing with is a group of one,
        prefix 0.
    """
    order = sorted(range(len(prompt_ids)), key=lambda i: tuple(prompt_ids[i]))
    # common[j]: the tokens the j-th sorted prompt shares with the one before it.
    common = [0] + [_common_prefix(prompt_ids[a], prompt_ids[b]) for a, b in pairwise(order)]
    saved = [0] * (len(order) + 1)  # saved[j]: the most the first j sorted rows can save
    start_of = list(range(-1, len(order)))  # where the best last group of the first j rows starts
    prefix_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        saved[end] = saved[end - 1]
        prefix = len(prompt_ids[order[end - 1]]) - 1
        for start in range(end - 2, -1, -1):
            prefix = min(prefix, common[start + 1], len(prompt_ids[order[start]]) - 1)
            if prefix < min_tokens:
                break  # a longer run only shares less
            if saved[start] + (end - start - 1) * prefix > saved[end]:
                saved[end] = saved[start] + (end - start - 1) * prefix
                start_of[end], prefix_of[end] = start, prefix
    groups: list[tuple[int, list[int]]] = []
    end = len(order)
    while end > 0:
        start = start_of[end]
        groups.append((prefix_of[end], sorted(order[start:end])))
        end = start
    return groups[::-1]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class PackedRows:
    """A batch of (prompt, action) rows as one sequence, each group's shared prefix once (:func:`pack_rows`).

    Attributes:
        input_ids: ``[1, N]`` the groups one after the other: a group's prefix, then each of its rows' rest of the
            prompt and action.
        position_ids: ``[1, N]`` each token's position in its own row (a row's tokens continue from its prefix).
        layout: what each token attends to.
        action_index: ``[B, width_a]`` the position whose hidden state predicts each action token (padding repeats a
            row's last one).
    """

    input_ids: Tensor
    position_ids: Tensor
    layout: PrefixLayout
    action_index: Tensor


def pack_rows(
    prompt_ids: Sequence[Sequence[int]],
    action_ids: Sequence[Sequence[int]],
    groups: Sequence[tuple[int, Sequence[int]]],
    width_a: int,
) -> PackedRows:
    """Pack the rows by their :func:`shared_prefix_groups`, actions padded to ``width_a`` in the index."""
    tokens: list[int] = []
    positions: list[int] = []
    blocks: list[tuple[int, int, int, int]] = []
    action_index = torch.zeros((len(prompt_ids), width_a), dtype=torch.long)
    for prefix, rows in groups:
        prefix_start = len(tokens)
        if prefix:
            blocks.append((prefix_start, prefix, 0, 0))
            tokens += prompt_ids[rows[0]][:prefix]
            positions += range(prefix)
        for row in rows:
            own = [*prompt_ids[row][prefix:], *action_ids[row]]
            blocks.append((len(tokens), len(own), prefix_start, prefix))
            # The row's last prompt token predicts its first action token.
            last_prompt = len(tokens) + len(prompt_ids[row]) - prefix - 1
            action_index[row] = last_prompt + torch.arange(width_a).clamp(max=max(len(action_ids[row]) - 1, 0))
            tokens += own
            positions += range(prefix, prefix + len(own))
    return PackedRows(
        torch.tensor([tokens], dtype=torch.long),
        torch.tensor([positions], dtype=torch.long),
        PrefixLayout.of_blocks(blocks, len(tokens)),
        action_index,
    )


def packed_decoder_states(model: torch.nn.Module, packed: PackedRows) -> Tensor:
    """:func:`decoder_states` of a packed sequence, ``[N, hidden]``.

    Raises:
        LearnerError: the policy's attention is not :data:`SHARED_PREFIX_ATTENTION` in every layer.
    """
    device = next(model.parameters()).device
    layout = packed.layout.to(device)
    length = packed.input_ids.shape[1]
    # transformers takes a 4D mask as given and builds none; the layout, not this placeholder, says what is seen.
    placeholder = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device).expand(1, 1, length, length)
    out = _causal_lm(model).get_decoder()(
        input_ids=packed.input_ids.to(device),
        attention_mask=placeholder,
        position_ids=packed.position_ids.to(device),
        use_cache=False,
        shared_prefix=layout,
    )
    layers = text_config(model).num_hidden_layers
    if layout.calls != layers:
        raise LearnerError(
            f"a packed pass reached {layout.calls} of the policy's {layers} attention layers through "
            f"{SHARED_PREFIX_ATTENTION} (use_shared_prefix_attention first)"
        )
    return out.last_hidden_state[0]


def _causal_lm(model: torch.nn.Module) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def output_logits(model: torch.nn.Module, hidden: Tensor, token_ids: Tensor | None = None) -> Tensor:
    """Logits of ``hidden`` ``[N, hidden]`` for every token (``[N, V]``) or only for ``token_ids`` (``[N, K]``): the
    same numbers as the model's own forward, computed for the rows that are needed."""
    head = _causal_lm(model).get_output_embeddings()
    vocab_size = text_config(model).vocab_size
    weight = head.weight[:vocab_size]
    bias = None if head.bias is None else head.bias[:vocab_size]
    if token_ids is not None:
        weight = weight[token_ids]
        bias = None if bias is None else bias[token_ids]
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    cap = getattr(text_config(model), "final_logit_softcapping", None)
    return logits if not cap else torch.tanh(logits / cap) * cap


def check_output_head(model: torch.nn.Module) -> None:
    """Refuse a model whose logits are not :func:`output_logits` of its :func:`decoder_states` (a LoRA on the
    output head, a logit scale): checked against the model's own forward on a few tokens.

    Raises:
        LearnerError: the head is not a plain linear layer, or the two disagree.
    """
    if type(_causal_lm(model).get_output_embeddings()) is not torch.nn.Linear:
        raise LearnerError("the policy's output head is not a plain linear layer (LoRA on lm_head is not supported)")
    vocab_size = text_config(model).vocab_size
    ids = torch.arange(1, 9, device=next(model.parameters()).device).unsqueeze(0) % vocab_size
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits[0, :, :vocab_size].float()
        got = output_logits(model, decoder_states(model, ids, torch.ones_like(ids), positions)[0])
    if not torch.allclose(got, expected, atol=1e-3 * max(1.0, float(expected.abs().max())), rtol=0):
        raise LearnerError(
            "the policy's logits are not its output head applied to its last hidden states (a logit scale or "
            f"soft cap the learner does not reproduce: max difference {float((got - expected).abs().max()):.3g})"
        )


def action_logprobs(
    model: torch.nn.Module,
    tokenizer: Encoder,
    prompts: Sequence[ModelPrompt],
    action_token_ids: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[str] | None] | None = None,
    *,
    temperature: float = 1.0,
    constraint: ChoiceConstraint | None = None,
    shared_prefix_tokens: int = 0,
) -> ActionLogProbs:
    """Compute log π(a|s) for a batch, differentiably.

    Only the action positions reach the output head. In choice mode only the tokens the grammar allows there do
    (the union over the batch's action positions, a few hundred at most): the log-softmax over the allowed set is
    exactly the server's masked log-softmax over the vocabulary, without a [rows, width, vocabulary] tensor.

    Args:
        model: a causal LM (transformers, optionally wrapped by peft) in the state to evaluate.
        tokenizer: its tokenizer (a vision policy's processor); prompts are encoded as the server encodes them
            (special tokens added the tokenizer's way, image placeholders expanded the processor's way).
        prompts: the prompts the server was given (:class:`distrl_stream.policy.prompt.Prompter`), or the server's
            tokenisation of them (:class:`~distrl_stream.policy.prompt.TokenPrompt`).
        action_token_ids: the token ids the server returned for each action, including the final stop token.
        candidates: per sample, the choice the server was asked to make (choice mode), or None (free mode);
            None for the whole argument means free mode for all.
        temperature: the sampling temperature the server used (processed log-probs are after temperature).
        constraint: a reusable :class:`ChoiceConstraint`; built from ``tokenizer`` when needed and not given.
        shared_prefix_tokens: pack rows whose prompts share at least this many leading tokens into one sequence
            that computes the shared prefix once (the same log π and gradient); 0 never packs. The model needs
            :func:`use_shared_prefix_attention`; a batch with images is never packed.

    Returns:
        :class:`ActionLogProbs` with tensors on the model's device.

    Raises:
        ActionConstraintError: an action's tokens are impossible under its candidates.
        LearnerError: a packed pass on a model without :func:`use_shared_prefix_attention`.
    """
    if len(prompts) != len(action_token_ids) or (candidates is not None and len(candidates) != len(prompts)):
        raise ValueError("prompts, action_token_ids and candidates must have the same length")
    device = next(model.parameters()).device
    vocab_size = text_config(model).vocab_size
    batch = len(prompts)
    encoded = encode_prompts(tokenizer, prompts)
    prompt_ids = encoded.input_ids
    width_a = max(max((len(a) for a in action_token_ids), default=0), 1)
    tokenizer = text_tokenizer(tokenizer)
    groups = shared_prefix_groups(prompt_ids, shared_prefix_tokens) if shared_prefix_tokens else []
    if any(prefix for prefix, _ in groups) and not encoded.images:
        packed = pack_rows(prompt_ids, action_token_ids, groups, width_a)
        hidden = packed_decoder_states(model, packed)[packed.action_index.to(device)]
    else:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        states, width_p = padded_decoder_states(model, prompt_ids, action_token_ids, encoded.images_to(device), pad)
        # The state at column width_p - 1 + t predicts action token t; the last action token predicts nothing.
        hidden = states[:, width_p - 1 : width_p - 1 + width_a]

    token_lp = torch.zeros((batch, width_a), device=device)
    entropy = torch.zeros((batch, width_a), device=device)
    mask = torch.zeros((batch, width_a), dtype=torch.bool)
    free_rows: list[int] = []
    choice_rows: list[int] = []
    for row, a_ids in enumerate(action_token_ids):
        mask[row, : len(a_ids)] = True
        if len(a_ids):
            is_choice = candidates is not None and candidates[row] is not None
            (choice_rows if is_choice else free_rows).append(row)
    for rows, allowed in (
        (free_rows, None),
        (choice_rows, _allowed_tokens(tokenizer, vocab_size, action_token_ids, candidates, constraint, choice_rows)),
    ):
        if not rows:
            continue
        where = (mask & torch.isin(torch.arange(batch), torch.tensor(rows)).unsqueeze(-1)).to(device)
        taken = torch.tensor([t for r in rows for t in action_token_ids[r]], dtype=torch.long, device=device)
        h = hidden[where]  # [N, hidden]: the real action positions of these rows, row-major
        if allowed is None:
            logp = torch.log_softmax(output_logits(model, h) / temperature, dim=-1)
            picked = taken
        else:
            tokens, allowed_at = (t.to(device) for t in allowed)  # [K] token ids; [N, K] which each position allows
            logits = output_logits(model, h, tokens) / temperature
            logp = torch.log_softmax(logits.masked_fill(~allowed_at, float("-inf")), dim=-1)
            picked = torch.searchsorted(tokens, taken)  # tokens is sorted and holds every taken id
        lp, ent = _gather_and_entropy(logp, picked)
        token_lp = token_lp.masked_scatter(where, lp)
        entropy = entropy.masked_scatter(where, ent)
    return ActionLogProbs(token_logprobs=token_lp, entropy=entropy, mask=mask.to(device))


def padded_decoder_states(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    action_token_ids: Sequence[Sequence[int]],
    images: dict[str, Tensor] | None = None,
    pad: int = 0,
) -> tuple[Tensor, int]:
    """The unpacked pass: ``[B, width_p + width_a, hidden]`` decoder states of one padded row per prompt and
    ``width_p``, the column where every row's action starts (its last prompt token is at ``width_p - 1``).

    Prompts are left-padded and actions right-padded, so one slice of the states serves the whole batch; position
    ids restart at 0 on each row's first real token, as in vLLM. Image inputs (``images``) go with their prompts.
    """
    device = next(model.parameters()).device
    batch = len(prompt_ids)
    width_p = max(len(p) for p in prompt_ids)
    width_a = max((len(a) for a in action_token_ids), default=0)
    input_ids = torch.full((batch, width_p + width_a), pad, dtype=torch.long)
    attention = torch.zeros((batch, width_p + width_a), dtype=torch.long)
    for row, (p_ids, a_ids) in enumerate(zip(prompt_ids, action_token_ids, strict=True)):
        input_ids[row, width_p - len(p_ids) : width_p] = torch.tensor(list(p_ids), dtype=torch.long)
        input_ids[row, width_p : width_p + len(a_ids)] = torch.tensor(list(a_ids), dtype=torch.long)
        attention[row, width_p - len(p_ids) : width_p + len(a_ids)] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    hidden = decoder_states(model, input_ids.to(device), attention.to(device), position_ids.to(device), images)
    return hidden, width_p


def _gather_and_entropy(logp: Tensor, picked: Tensor) -> tuple[Tensor, Tensor]:
    """log p of each row's picked column, and each row's entropy (forbidden columns, log p = -inf, add 0)."""
    # Zeroing -inf before the product keeps -inf·0 = NaN out of both the value and its gradient.
    finite = torch.where(torch.isfinite(logp), logp, torch.zeros((), device=logp.device))
    return logp.gather(-1, picked.unsqueeze(-1)).squeeze(-1), -(logp.exp() * finite).sum(-1)


def _allowed_tokens(
    tokenizer: PreTrainedTokenizerBase,
    vocab_size: int,
    action_token_ids: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[str] | None] | None,
    constraint: ChoiceConstraint | None,
    rows: Sequence[int],
) -> tuple[Tensor, Tensor] | None:
    """The tokens the choice grammar allows at any action position of ``rows`` (sorted, ``[K]``), and which of them
    each position allows (``[N, K]``, positions row-major as in the batch). One step's vocabulary mask exists at a
    time."""
    if not rows or candidates is None:
        return None
    constraint = constraint or ChoiceConstraint(tokenizer, vocab_size)
    positions: list[Tensor] = []
    token_ids: list[Tensor] = []
    offset = 0
    for r in rows:
        pos, tok = constraint.allowed(candidates[r] or (), action_token_ids[r]).nonzero(as_tuple=True)
        positions.append(pos + offset)
        token_ids.append(tok)
        offset += len(action_token_ids[r])
    flat_pos, flat_tok = torch.cat(positions), torch.cat(token_ids)
    tokens, column = torch.unique(flat_tok, sorted=True, return_inverse=True)
    allowed_at = torch.zeros((offset, len(tokens)), dtype=torch.bool)
    allowed_at[flat_pos, column] = True
    return tokens, allowed_at
