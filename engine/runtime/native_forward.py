"""The static runtime's forward of a few tokens in one C call, for int8 Llama-layout models on
the CPU (`decoder_forward.c`, built with the int8 kernel).

Why: a compiled one-token forward of the int8 demo target took ~15.5 ms on the 2-core
development CPU, of which the 121 weight products were ~7.6 ms; the rest was the machinery
between them (dynamo's guards, inductor's wrapper and small kernels, attention's dispatch).
In C that machinery is gone, and no compile is needed for it: the forward runs at full speed
from the first token (docs/BENCHMARKS.md, "A native forward").

What it runs: the forward `static_cache_forward.StaticCacheForward` runs, over the same KV cache
tensors, so the two can take turns within a conversation. Where a model runs here, every
forward does, prompts included (in pieces of PROMPT_ROWS tokens); forward_plan.py decides
that, and says why. Its products are the very floats of the torch forward's; the norms, rotary embedding and
attention are summed in another order, so logits agree to float32 rounding (tests: against
the eager forward, chains, trees and features).

Which models: Llama, Mistral, Qwen2 and Qwen3 layouts (plain RMSNorm, Qwen3's on each query
and key head too, SiLU MLP, full rotary heads, no sliding windows in use) whose every projection is an int8 layer (`int8_weights`), in
float32 on the CPU, where the int8 kernel was built. `refusal` names what stops any other.
Whether a model that can run here does is forward_plan.py's choice.
"""
from __future__ import annotations

import ctypes

import torch

from . import int8_kernel, key_blocks
from .cpu import forward_threads
from .int4_weights import Int4Linear
from .int8_weights import Int8Embedding, Int8Linear
# The C structs' mirrors, checked against the library's own layout when it is loaded.
from .kernel_abi import DecoderStruct, Int8Struct, LayerStruct
from .key_blocks import KeyLayout
from .static_families import recipe_for, static_refusal

NATIVE_NAME = "torch (native int8 forward)"  # the runtime's name where it runs
# Prompts run here too, in pieces of this many tokens (the static runtime's widest bucket), so
# that every forward, a verify as a step, runs the same arithmetic: the demo target read
# prompts of 24-1,000 tokens 1.6-2.6x faster than in eager torch with AVX-512 VNNI, and pieces
# of 64 beat 16 and 32 (docs/BENCHMARKS.md).
PROMPT_ROWS = 64
NATIVE_RECIPES = {"Llama", "Mistral", "Qwen2", "Qwen3"}
NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def refusal(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why `model` on `device` cannot run natively; None when it can."""
    reason = static_refusal(model)
    if reason is not None:
        return reason
    recipe, config = recipe_for(model), model.config
    if recipe.name not in NATIVE_RECIPES or any(recipe.layer_windows(config)):
        return f"the native forward runs {', '.join(sorted(NATIVE_RECIPES))} layouts without sliding windows"
    if device.type != "cpu" or model.dtype != torch.float32:
        return "the native forward runs float32 on the CPU"
    if getattr(config, "hidden_act", None) != "silu":
        return f"the native forward runs SiLU MLPs, not {getattr(config, 'hidden_act', None)!r}"
    decoder = model.model
    int8 = "the native forward runs int8 and int4 models (int8-wo, int4-wo)"
    if not isinstance(decoder.embed_tokens, Int8Embedding) or decoder.embed_tokens.embed_scale is not None:
        return int8
    if not isinstance(model.lm_head, Int8Linear):
        return int8
    for layer in decoder.layers:
        attention, mlp = layer.self_attn, layer.mlp
        parts = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(isinstance(part, (Int8Linear, Int4Linear)) for part in parts):
            return int8
        if len({type(part) for part in parts[:3]}) > 1 or type(parts[4]) is not type(parts[5]):
            return "the native forward joins q, k and v (and gate and up): each set all int8 or all int4"
        if any(part.bias is not None for part in parts[3:]):
            return "the native forward runs no biases past the attention's inputs"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attention.q_norm, attention.k_norm] if recipe.qk_norm else []
        if any(type(norm).__name__ not in NORMS or norm.variance_epsilon != decoder.norm.variance_epsilon for norm in norms):
            return "the native forward runs Llama's RMSNorm, with one epsilon throughout"
    if type(decoder.norm).__name__ not in NORMS:
        return "the native forward runs Llama's RMSNorm, with one epsilon throughout"
    reason = _shape_refusal(model)
    if reason is not None:
        return reason
    # Last: it builds the kernel on a first run, which the checks above spare other models.
    return int8_kernel.unavailable_reason()


def _shape_refusal(model: torch.nn.Module) -> str | None:
    """The C code trusts its sizes: every weight must have the shape the config gives it, and
    the rotary embedding must turn whole heads (not Phi-3's or a partial_rotary_factor's part)."""
    config, decoder = model.config, model.model
    attention = decoder.layers[0].self_attn
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, attention.head_dim
    hidden, intermediate, vocab = config.hidden_size, config.intermediate_size, model.lm_head.weight.shape[0]
    if dim % 2 or dim > 512 or heads % kv_heads:
        return f"the native forward runs even heads of at most 512 and whole query groups (head_dim {dim}, {heads}/{kv_heads} heads)"
    with torch.inference_mode():
        cos, _ = decoder.rotary_emb(torch.zeros(1, 1, hidden), torch.zeros(1, 1, dtype=torch.long))
    if cos.shape[-1] != dim:
        return f"the native forward rotates whole heads; this model rotates {cos.shape[-1]} of {dim}"
    shapes = [(model.lm_head, (vocab, hidden)), (decoder.embed_tokens, (vocab, hidden))]
    for layer in decoder.layers:
        attention, mlp = layer.self_attn, layer.mlp
        shapes += [(attention.q_proj, (heads * dim, hidden)), (attention.k_proj, (kv_heads * dim, hidden)),
                   (attention.v_proj, (kv_heads * dim, hidden)), (attention.o_proj, (hidden, heads * dim)),
                   (mlp.gate_proj, (intermediate, hidden)), (mlp.up_proj, (intermediate, hidden)),
                   (mlp.down_proj, (hidden, intermediate))]
    for module, shape in shapes:
        if isinstance(module, Int4Linear):
            if (module.out_features, module.in_features) != shape:
                return f"a weight of shape {(module.out_features, module.in_features)} where the config says {shape}"
        elif tuple(module.weight.shape) != shape or module.scale.dtype != torch.float32:
            return f"a weight of shape {tuple(module.weight.shape)} where the config says {shape}"
    return None


def cache_dtype() -> torch.dtype:
    """What the native forward keeps keys and values in: bf16 where the kernel build's attention
    multiplies in bf16 (the cache then holds half the bytes, and a step at a long context reads
    half), else float32."""
    return torch.bfloat16 if int8_kernel.attention_in_bf16() else torch.float32


def key_layout() -> KeyLayout:
    """How the native forward keeps keys: in the blocks of rows its build's scores read, or in
    rows (key_blocks.py)."""
    return key_blocks.layout(int8_kernel.key_block_rows())


def native_forward(forward) -> NativeForward | None:
    """The native forward over `forward`'s model and cache (a static_cache_forward.StaticCacheForward),
    or None where `refusal` says why not."""
    return NativeForward(forward) if refusal(forward.model, forward.cache[0][0].device) is None else None


def int8_struct(layer: Int8Linear | Int4Linear, keep: list) -> Int8Struct:
    """The C view of `layer`; `keep` collects the tensors whose addresses it holds."""
    if isinstance(layer, Int4Linear):
        bias = None if layer.bias is None else layer.bias.detach().float().contiguous()
        packed, scales = layer.packed.contiguous(), layer.scales.contiguous()
        keep.extend([packed, scales, bias])
        return Int8Struct(0, 0, 0, 0 if bias is None else bias.data_ptr(), layer.rows, layer.in_features,
                          packed.data_ptr(), scales.data_ptr())
    tensors = [layer.weight.contiguous(), layer.scale.contiguous(), layer.row_sums.contiguous()]
    bias = None if layer.bias is None else layer.bias.detach().float().contiguous()
    keep.extend(tensors + [bias])
    weight, scale, row_sums = tensors
    return Int8Struct(weight.data_ptr(), scale.data_ptr(), row_sums.data_ptr(), 0 if bias is None else bias.data_ptr(),
                      weight.shape[0], weight.shape[1], 0, 0)


class NativeForward:
    """Runs `forward`'s model over `forward`'s cache in C (the static runtime hands it chunks
    of up to PROMPT_ROWS tokens)."""

    def __init__(self, forward):
        model, config = forward.model, forward.model.config
        decoder = model.model
        attention = decoder.layers[0].self_attn
        self.library = int8_kernel.loaded_library()
        self.feature_layers = forward.feature_layers
        if any(not 0 <= layer < len(decoder.layers) for layer in self.feature_layers):
            raise ValueError(f"feature layers {list(self.feature_layers)} outside the model's {len(decoder.layers)}")
        self.hidden = config.hidden_size
        self.vocab = model.lm_head.weight.shape[0]
        keep: list = []  # every tensor whose address the C structs hold
        rows = forward.rows
        forward.hold_cache_in(cache_dtype(), key_layout())
        with torch.inference_mode():
            # The rotary embedding of every position, from the model's own module (its scaling included).
            probe = torch.zeros(1, 1, config.hidden_size)
            cos, sin = decoder.rotary_emb(probe, torch.arange(rows)[None])
            cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        keep += [cos, sin]
        layers = (LayerStruct * len(decoder.layers))()
        for index, (layer, joined, (keys, values)) in enumerate(zip(decoder.layers, forward.joined, forward.cache)):
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            norms += [layer.self_attn.q_norm, layer.self_attn.k_norm] if forward.recipe.qk_norm else [None, None]
            weights = [None if norm is None else norm.weight.detach().float().contiguous() for norm in norms]
            keep += weights
            addresses = [0 if weight is None else weight.data_ptr() for weight in weights]
            layers[index] = LayerStruct(addresses[0], addresses[1], int8_struct(joined.qkv, keep),
                                        int8_struct(layer.self_attn.o_proj, keep), int8_struct(joined.gate_up, keep),
                                        int8_struct(layer.mlp.down_proj, keep), keys.data_ptr(), values.data_ptr(),
                                        addresses[2], addresses[3])
        embeddings = decoder.embed_tokens
        final_norm = decoder.norm.weight.detach().float().contiguous()
        # The cache too: the C call releases the GIL, and it must not outlive what it writes into.
        keep += [embeddings.weight, embeddings.scale, final_norm, layers, forward.cache]
        self._decoder = DecoderStruct(
            len(decoder.layers), config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            attention.head_dim, config.intermediate_size, self.vocab, forward.cache_rows,
            float(decoder.norm.variance_epsilon), float(attention.scaling),
            embeddings.weight.data_ptr(), embeddings.scale.data_ptr(), final_norm.data_ptr(),
            int8_struct(model.lm_head, keep), cos.data_ptr(), sin.data_ptr(), rows, layers,
        )
        self._keep = keep
        self._features = (ctypes.c_int64 * max(len(self.feature_layers), 1))(*self.feature_layers)

    def __call__(
        self, ids: list[int], positions: list[int], rows: list[int], visible: torch.Tensor, first_row: int,
        wanted_from: int, want_hidden: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Tokens `ids` at `positions` write cache `rows`; token i sees cache row first_row + s
        where visible[i, s]. Returns the float32 logits of the tokens from `wanted_from` on,
        their final-norm hidden states when wanted, and every token's features when the
        forward records them (else None)."""
        count = len(ids)
        visible = visible.to(torch.bool).contiguous()
        ids_buffer = (ctypes.c_int64 * count)(*ids)
        positions_buffer = (ctypes.c_int64 * count)(*positions)
        rows_buffer = (ctypes.c_int64 * count)(*rows)
        wanted = count - wanted_from
        logits = torch.empty(wanted, self.vocab)
        hidden = torch.empty(wanted, self.hidden) if want_hidden else None
        features = torch.empty(count, len(self.feature_layers) * self.hidden) if self.feature_layers else None
        status = self.library.tandem_decoder_forward(
            ctypes.byref(self._decoder), count, ids_buffer, positions_buffer, rows_buffer, visible.data_ptr(),
            visible.shape[1], first_row, visible.shape[1], wanted_from, logits.data_ptr(),
            None if hidden is None else hidden.data_ptr(), self._features, len(self.feature_layers),
            None if features is None else features.data_ptr(), forward_threads(),
        )
        _raise_for(status)
        return logits, hidden, features

    def spans(
        self, ids: list[int], positions: list[int], rows: list[int], span_first: list[int], span_rows: list[int],
        wanted_from: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens of independent sequences in one forward: token i at `positions[i]` writes cache
        row `rows[i]` and sees the `span_rows[i]` rows from `span_first[i]` (its own sequence's,
        its own row the last). Returns the logits of the tokens from `wanted_from` on and every
        token's features (None when the forward records none). Many replies share each weight
        pass this way (engine/tools/distill/native_batch.py)."""
        count = len(ids)
        buffers = [(ctypes.c_int64 * count)(*values) for values in (ids, positions, rows, span_first, span_rows)]
        logits = torch.empty(count - wanted_from, self.vocab)
        features = torch.empty(count, len(self.feature_layers) * self.hidden) if self.feature_layers else None
        status = self.library.tandem_decoder_forward_spans(
            ctypes.byref(self._decoder), count, *buffers, wanted_from, logits.data_ptr(), self._features,
            len(self.feature_layers), None if features is None else features.data_ptr(), forward_threads(),
        )
        _raise_for(status)
        return logits, features


def _raise_for(status: int) -> None:
    """The C forward's status as an exception (0: none)."""
    if status == -1:
        raise MemoryError("out of memory for the native forward's activations")
    if status != 0:
        raise ValueError("the native forward was given tokens, positions or cache rows outside the model's, "
                         "or two tokens at one cache row")
