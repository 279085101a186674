"""What differs between the decoder families the static runtime runs: one recipe each, and
the one-line reason when a model cannot run static.

The static forward (`static_cache_forward.StaticCacheForward`) runs every family the same way:
embed; per layer norm, attention over the static cache, residual add, norm, MLP, residual
add; final norm; LM head. The model's own modules do each step's arithmetic, so much of
what sets the families apart needs nothing here: Gemma's scaled embeddings (its embedding
module multiplies), its RMSNorm's 1 + weight, Phi-3's fused gate_up_proj (its MLP splits
it), Gemma's query_pre_attn_scalar (its attention's `scaling`), Phi-3's partial rotary (its
module's `apply_rotary_pos_emb`). A recipe says only what our attention and layer code must
do differently, and which layers slide.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedConfig

# Rotary embeddings whose frequencies are fixed once the model is built. "dynamic" ones
# recompute them from each call's longest position with a Python branch on a tensor, which a
# graph cannot capture (a capture would freeze one branch); "longrope" switches them by each
# call's longest position too, so a prompt run in 64-token chunks would not get the eager
# frequencies. Unknown types stay eager to be safe.
FIXED_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}
ROPE_REFUSALS = {
    "dynamic": "its 'dynamic' rotary embedding recomputes its frequencies from each call's longest position, which a CUDA graph cannot capture",
    "longrope": "its 'longrope' rotary embedding switches frequencies by the longest position of each call, which a prompt run in chunks would not reproduce",
}
LAYER_TYPES = {"full_attention", "sliding_attention"}


def no_windows(config: PreTrainedConfig) -> list[int | None]:
    return [None] * config.num_hidden_layers


def one_window(config: PreTrainedConfig) -> list[int | None]:
    """Every layer slides when the config sets a window (Mistral, Phi-3)."""
    return [getattr(config, "sliding_window", None)] * config.num_hidden_layers


def windows_by_layer_type(config: PreTrainedConfig) -> list[int | None]:
    """The "sliding_attention" layers slide (Qwen2 and Qwen3 past max_window_layers, Gemma's
    local layers)."""
    window = getattr(config, "sliding_window", None)
    return [window if kind == "sliding_attention" else None for kind in config.layer_types]


@dataclass(frozen=True)
class FamilyRecipe:
    """How a family's decoder layer departs from Llama's."""

    name: str  # for messages: "Gemma 2"
    #: one qkv_proj giving the queries, keys and values in that order (Phi-3)
    fused_qkv: bool = False
    #: q_norm and k_norm: an RMSNorm over each query and key head before the rotary embedding (Qwen3, Gemma 3)
    qk_norm: bool = False
    #: Gemma's four norms: post_attention_layernorm on the attention output before its residual
    #: add, pre_feedforward_layernorm into the MLP, post_feedforward_layernorm on its output
    sandwich_norms: bool = False
    #: attention scores become cap * tanh(scores / cap), cap = config.attn_logit_softcapping
    #: (Gemma 2; transformers' Gemma 3 never passes its cap to the attention, so neither do we)
    caps_attention_logits: bool = False
    #: logits likewise with config.final_logit_softcapping (Gemma 2 and 3)
    caps_final_logits: bool = False
    #: rotary_emb(x, positions, layer_type): local layers have their own base (Gemma 3)
    rotary_by_layer_type: bool = False
    #: the sliding window of each layer (None: it sees every earlier position)
    layer_windows: Callable[[PreTrainedConfig], list[int | None]] = no_windows


# What Gemma 2 and Gemma 3 share.
GEMMA = {"sandwich_norms": True, "caps_final_logits": True, "layer_windows": windows_by_layer_type}
RECIPES = {
    "llama": FamilyRecipe("Llama"),
    "mistral": FamilyRecipe("Mistral", layer_windows=one_window),
    "qwen2": FamilyRecipe("Qwen2", layer_windows=windows_by_layer_type),
    "qwen3": FamilyRecipe("Qwen3", qk_norm=True, layer_windows=windows_by_layer_type),
    "phi3": FamilyRecipe("Phi-3", fused_qkv=True, layer_windows=one_window),
    "gemma2": FamilyRecipe("Gemma 2", caps_attention_logits=True, **GEMMA),
    "gemma3_text": FamilyRecipe("Gemma 3 text", qk_norm=True, rotary_by_layer_type=True, **GEMMA),
}


def recipe_for(model: torch.nn.Module) -> FamilyRecipe:
    """The recipe the static runtime runs `model` with; ValueError with the reason when none fits."""
    reason = static_refusal(model)
    if reason is not None:
        raise ValueError(f"the static runtime cannot run this model: {reason}")
    return RECIPES[model.config.model_type]


def static_refusal(model: torch.nn.Module) -> str | None:
    """Why the static runtime cannot run `model` exactly, in one line; None when it can."""
    config = model.config
    recipe = RECIPES.get(config.model_type)
    if recipe is None:
        families = ", ".join(known.name for known in RECIPES.values())
        return f"no static-cache recipe for {config.model_type!r} models (it runs {families})"
    if getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False):
        return "bitsandbytes' int8 and 4-bit layers cannot be captured in a CUDA graph"
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional (an embedding model), not causal"
    other_layers = set(getattr(config, "layer_types", None) or []) - LAYER_TYPES
    if other_layers:
        return f"its {', '.join(sorted(other_layers))} layers are not ones the static runtime runs"
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not layers or not all(_has_layout(layer, recipe) for layer in layers):
        return f"its layers do not have the {recipe.name} layout the static runtime expects"
    return _rope_refusal(getattr(decoder, "rotary_emb", None))


def rotary_function(model: torch.nn.Module) -> Callable:
    """The family's own `apply_rotary_pos_emb` (Phi-3's rotates only part of each head)."""
    return importlib.import_module(type(model.model.layers[0].self_attn).__module__).apply_rotary_pos_emb


def _has_layout(layer: torch.nn.Module, recipe: FamilyRecipe) -> bool:
    attention = getattr(layer, "self_attn", None)
    projections = ("qkv_proj",) if recipe.fused_qkv else ("q_proj", "k_proj", "v_proj")
    norms = ("input_layernorm", "post_attention_layernorm")
    if recipe.sandwich_norms:
        norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    return (
        attention is not None
        and all(hasattr(attention, name) for name in projections)
        and hasattr(attention, "q_norm") == recipe.qk_norm
        and all(hasattr(layer, name) for name in norms)
    )


def _rope_refusal(rotary_embedding: torch.nn.Module | None) -> str | None:
    if rotary_embedding is None:
        return "it has no rotary embedding module the static runtime knows"
    rope_type = getattr(rotary_embedding, "rope_type", None)
    # transformers keeps one type per layer kind ({"full_attention": ...}) for some families.
    for kind in rope_type.values() if isinstance(rope_type, dict) else [rope_type]:
        if kind not in FIXED_ROPE_TYPES:
            return ROPE_REFUSALS.get(kind, f"its {kind!r} rotary embedding is not one known to keep fixed frequencies")
    return None
