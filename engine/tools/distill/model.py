"""The draft's shape: Llama-style presets on the target's vocabulary, their initialisation,
and a timing of one decode step, which is what decides whether a preset is small enough.

A draft pays off only when one of its forwards costs a small fraction of the target's. On a
CPU a single-token forward is bound by memory traffic and per-layer overhead, not by
arithmetic, so presets are few-layer and narrow, and the output layer (vocabulary × width,
tied to the input embedding) is a large share of their cost.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from ...config import ConfigError
from ...runtime.reduced_vocabulary import ReducedVocabulary

INITS = ("pca", "random")
# Not a fixed shape: the target's own embeddings and first layers, at its width, started from
# its weights. On the demo pair (793k reply tokens), the first 4 of the target's 30 layers
# agreed with its first choice on 26% of held-out positions after 40 steps and 49.3% after
# 1,226; a `small` draft from scratch reached 36% after its whole 491 steps. A prefix's call
# costs more per layer than a narrow draft's, so it pays where acceptance matters most.
PREFIX = "prefix"
DEFAULT_PREFIX_LAYERS = 4


@dataclass(frozen=True)
class DraftShape:
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int


PRESETS: dict[str, DraftShape] = {
    # For tests and smoke runs: trains in seconds, useless as a draft.
    "tiny": DraftShape(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128),
    # The real draft: 16.4M parameters, 12.6M of them the tied 49,152 × 256 embedding.
    # Measured against the demo target (SmolLM2-135M: 576 wide, 30 layers) with `forward_ms`:
    # one token after a 200-token cache, both models interleaved in one process, median of
    # 5 rounds × 20 steps, on the 2-core development CPU while other jobs kept it busy.
    #   1 thread:   bf16 9.0 ms vs 75.7 ms (12%), fp32 9.6 ms vs 72.6 ms (14%)
    #   2 threads:  bf16 15.6 ms vs 186 ms (7%),  fp32 13.9 ms vs 178 ms (8%)
    # Per-layer overhead dominates at this size: 320 wide cost 13.5% (bf16, 1 thread), 6
    # layers 17–20%, while 3 layers saved only ~2 points over 4.
    "small": DraftShape(hidden_size=256, layers=4, heads=4, kv_heads=1, intermediate_size=1024),
}


SIZES = (*PRESETS, PREFIX)


def prefix_shape(target_config: Any, layers: int) -> DraftShape:
    """The shape of a draft made of the target's first `layers` layers."""
    if getattr(target_config, "model_type", None) != "llama":
        raise ConfigError(f"a {PREFIX} draft is cut from a Llama-architecture target; this one is {target_config.model_type!r}")
    if not 1 <= layers < target_config.num_hidden_layers:
        raise ConfigError(f"a {PREFIX} draft keeps 1 to {target_config.num_hidden_layers - 1} of the target's layers, not {layers}")
    heads = target_config.num_attention_heads
    if getattr(target_config, "head_dim", None) not in (None, target_config.hidden_size // heads):
        raise ConfigError(f"a {PREFIX} draft needs a target whose head width is its width over its head count")
    return DraftShape(
        hidden_size=target_config.hidden_size,
        layers=layers,
        heads=heads,
        kv_heads=target_config.num_key_value_heads,
        intermediate_size=target_config.intermediate_size,
    )


def draft_config(
    target_config: Any, shape: DraftShape, vocabulary: ReducedVocabulary | None = None, tied: bool = True
) -> LlamaConfig:
    """A Llama config of `shape` that shares the target's vocabulary (or `vocabulary`'s part
    of it), special ids and RoPE."""

    def special(token_id: Any) -> Any:
        if vocabulary is None or token_id is None:
            return token_id
        if isinstance(token_id, (list, tuple)):
            return [special(one) for one in token_id]
        return vocabulary.to_model_ids([int(token_id)])[0]

    return LlamaConfig(
        vocab_size=target_config.vocab_size if vocabulary is None else vocabulary.size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden_size // shape.heads,
        max_position_embeddings=getattr(target_config, "max_position_embeddings", 2048),
        rope_parameters=getattr(target_config, "rope_parameters", None),
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-5),
        # Tied by default: the vocabulary × width matrix is most of a narrow draft's weights and time.
        tie_word_embeddings=tied,
        bos_token_id=special(target_config.bos_token_id),
        eos_token_id=special(target_config.eos_token_id),
        pad_token_id=special(getattr(target_config, "pad_token_id", None)),
    )


def build_draft(
    target: PreTrainedModel, shape: DraftShape, init: str, seed: int, vocabulary: ReducedVocabulary | None = None
) -> LlamaForCausalLM:
    """A fresh fp32 draft for `target`; `init` "pca" starts its embeddings from the target's.
    With `vocabulary`, the draft knows only its kept tokens and one row for all others."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
    # transformers' initialisers draw from the global generator: seed a private fork of it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = LlamaForCausalLM(draft_config(target.config, shape, vocabulary))
    if init == "pca":
        projected = projected_embeddings(target, shape.hidden_size)
        with torch.no_grad():
            draft.get_input_embeddings().weight.copy_(_vocabulary_rows(projected, vocabulary))
    return draft


def build_prefix_draft(target: PreTrainedModel, layers: int, vocabulary: ReducedVocabulary | None = None) -> LlamaForCausalLM:
    """A fp32 draft that is the target cut after its first `layers` layers: the same
    embeddings (the kept rows only, with `vocabulary`), layers and final norm, so training
    starts from a model that already computes the target's early features, and reads them out
    through the target's own final norm and output layer."""
    shape = prefix_shape(target.config, layers)
    tied = bool(getattr(target.config, "tie_word_embeddings", True))
    draft = LlamaForCausalLM(draft_config(target.config, shape, vocabulary, tied))
    kept_layers = tuple(f"model.layers.{index}." for index in range(layers))
    state = {
        name: tensor
        for name, tensor in target.state_dict().items()
        if name.startswith(kept_layers) or name == "model.norm.weight"
    }
    state["model.embed_tokens.weight"] = _vocabulary_rows(target.get_input_embeddings().weight.detach().float(), vocabulary)
    if not tied:
        state["lm_head.weight"] = _vocabulary_rows(target.get_output_embeddings().weight.detach().float(), vocabulary)
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # a Llama variant with parts a plain Llama lacks
        raise ConfigError(f"the target's layers do not fit a Llama draft (missing {missing}, unexpected {unexpected})")
    draft.tie_weights()
    return draft


def _vocabulary_rows(matrix: torch.Tensor, vocabulary: ReducedVocabulary | None) -> torch.Tensor:
    """`matrix`'s rows for a reduced draft: the kept tokens', then one shared row that stands
    for every other token: their mean."""
    if vocabulary is None:
        return matrix
    kept = vocabulary.kept_mask()
    return torch.cat([matrix[list(vocabulary.kept_ids)], matrix[~kept].mean(0, keepdim=True)])


def projected_embeddings(target: PreTrainedModel, width: int) -> torch.Tensor:
    """The target's input embeddings (V, D) projected on their top `width` principal axes.

    With tied embeddings the target's logits are `h · Eᵀ`; projecting E onto the axes that
    carry most of its energy keeps the draft's logits `(hP) · (EP)ᵀ` close to the target's for
    hidden states in that subspace. The uncentred second moment is used, so a common offset
    shared by all rows is kept too.

    Measured on 27k tokens of demo-target replies (small preset, held-out KL / greedy
    agreement): after 80 steps 4.87 / 11.3% against 5.11 / 11.5% from random init; after 32
    steps 5.54 / 6.8% against 5.67 / 4.4%. A modest head start, although the untrained draft
    scores worse (KL 28 against 9: at the target's scale its logits are large and random).
    Rescaling the projection to the usual 0.02 spread lost the head start.
    """
    embeddings = target.get_input_embeddings().weight.detach().float()  # (V, D)
    if width >= embeddings.shape[1]:
        padding = torch.zeros(embeddings.shape[0], width - embeddings.shape[1])
        return torch.cat([embeddings, padding], dim=1)
    second_moment = embeddings.T @ embeddings  # (D, D)
    _, axes = torch.linalg.eigh(second_moment)  # eigenvalues ascending
    projection = axes[:, -width:].flip(1)  # (D, width), strongest axis first
    return embeddings @ projection  # (V, width)


def shape_summary(shape: DraftShape, vocab_size: int) -> dict[str, Any]:
    """The shape with its parameter count, for the report."""
    per_layer = (
        2 * shape.hidden_size * shape.hidden_size  # q, o
        + 2 * shape.hidden_size * (shape.hidden_size // shape.heads) * shape.kv_heads  # k, v
        + 3 * shape.hidden_size * shape.intermediate_size  # gate, up, down
    )
    return {**asdict(shape), "parameters": vocab_size * shape.hidden_size + shape.layers * per_layer}


@torch.inference_mode()
def forward_ms(model: PreTrainedModel, context_tokens: int = 200, repeats: int = 30) -> float:
    """Median ms of one single-token decode step after `context_tokens` cached tokens.

    The cache is cropped back after every step so all repeats see the same context length.
    """
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    vocab = model.config.vocab_size
    context = torch.randint(0, vocab, (1, context_tokens), device=device)
    model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = torch.randint(0, vocab, (1, 1), device=device)
    position = torch.tensor([[context_tokens]], device=device)
    times = []
    for _ in range(repeats + 3):  # the first few warm up allocators and caches
        start = time.perf_counter()
        model(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        cache.crop(-1)  # transformers 5: a negative count of tokens to drop
    return 1000 * statistics.median(times[3:])
