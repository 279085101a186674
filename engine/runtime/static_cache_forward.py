"""One forward of a decoder over a preallocated KV cache written at explicit slots: the
static forward that the static runtime (torch_static.py) runs eagerly, compiled or captured
as CUDA graphs, and whose model and cache the native forward (native_forward.py) reads.

The model's own modules (embeddings, norms, projections, MLPs, rotary embedding) do the
arithmetic; only attention and the cache are ours, because transformers' StaticCache writes
at an internal counter rather than at given positions (which a tree needs). What differs
between the families it runs (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and 3) is a
recipe in static_families.py. The cache keeps every position, sliding-window layers too:
their mask hides what lies more than a window behind each token, so trees are compacted by
slot as in any other model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .exact_attention import exact_attention
from .joined_projections import JoinedProjections, joined_mlp, joined_projections
from .key_blocks import KeyLayout, KeyRows
from .rms_norm_cuda import fused_norm
from .static_families import recipe_for, rotary_function

# A forward's outputs, (n, V) logits, the (n, D) final-norm hidden states they came from, and
# the (n, F) inputs of the feature layers (F = 0 without any).
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# A decoder layer's norms, by the names transformers gives them (Gemma's sandwich has all four).
NORM_NAMES = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


class StaticCacheForward:
    """One forward of a decoder over a preallocated KV cache of `rows` rows, in the way its
    family's recipe says (static_families.py); ValueError for a model it cannot run."""

    def __init__(self, model: torch.nn.Module, rows: int, device: torch.device, feature_layers: tuple[int, ...] = ()):
        self.model = model
        self.recipe = recipe_for(model)
        self.rows = rows
        self.cache_rows = rows  # the rows the cache holds: more where its keys' blocks round them up
        self.key_layout: KeyLayout = KeyRows()
        self.feature_layers = tuple(feature_layers)
        config = model.config
        attention = model.model.layers[0].self_attn
        dtype = model.dtype  # the compute dtype (an int8-wo model: float32 on the CPU, bf16 on CUDA)
        kv_heads = config.num_key_value_heads
        self.query_groups = config.num_attention_heads // kv_heads  # query heads per key/value head
        self.rotate = rotary_function(model)
        self.sliding_windows = self.recipe.layer_windows(config)  # per layer; None: it sees every position
        # The rotary embedding each layer reads: by layer type (Gemma 3), else the one under None.
        self.rotary_kinds = list(config.layer_types) if self.recipe.rotary_by_layer_type else [None] * len(model.model.layers)
        self.attention_cap = config.attn_logit_softcapping if self.recipe.caps_attention_logits else None
        self.joined = [joined_projections(layer, self.recipe.fused_qkv) for layer in model.model.layers]
        # On a GPU each Llama-style norm is one Triton kernel rather than seven (rms_norm_cuda.py).
        norm_of = fused_norm if device.type == "cuda" else (lambda norm: norm)
        self.norms = [
            {name: norm_of(getattr(layer, name)) for name in NORM_NAMES if hasattr(layer, name)} for layer in model.model.layers
        ]
        self.final_norm = norm_of(model.model.norm)
        self.logit_cap = config.final_logit_softcapping if self.recipe.caps_final_logits else None
        shape = (1, kv_heads, rows, attention.head_dim)
        with torch.inference_mode():
            self.cache = [
                (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in model.model.layers
            ]
            # The position of the token in each row, which sliding windows are measured in.
            self.row_positions = torch.zeros(rows, dtype=torch.long, device=device) if any(self.sliding_windows) else None

    def hold_cache_in(self, dtype: torch.dtype, key_layout: KeyLayout) -> None:
        """The cache anew in `dtype`, its keys in `key_layout` (the native forward's bf16 build
        keeps bf16 keys in blocks, key_blocks.py, and bf16 values), before anything is written
        into it."""
        self.key_layout, self.cache_rows = key_layout, key_layout.rounded(self.rows)
        with torch.inference_mode():
            self.cache = [
                (key_layout.zeros(keys.shape[:2], self.cache_rows, keys.shape[-1], dtype, keys.device),
                 torch.zeros(*values.shape[:2], self.cache_rows, values.shape[-1], dtype=dtype, device=values.device))
                for keys, values in self.cache
            ]

    @property
    def cache_bytes(self) -> int:
        return sum(keys.numel() * keys.element_size() + values.numel() * values.element_size() for keys, values in self.cache)

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor
    ) -> Outputs:
        """ids, positions, rows: (n,); visible: (n, window) bool over the cache's first
        `window` rows. Writes each token's keys and values at its row, then attends within
        the window. Returns (n, V) logits, the (n, D) final-norm hidden states the LM head
        read and the (n, F) inputs of the feature layers, all in the model's dtype."""
        decoder = self.model.model
        count, window = visible.shape
        hidden = decoder.embed_tokens(ids[None])  # (1, n, H)
        rotations = self._rotations(hidden, positions)
        masks = self._masks(visible, positions, rows, hidden.dtype)
        captured = []  # the residual stream entering each feature layer
        for index, (layer, (keys, values)) in enumerate(zip(decoder.layers, self.cache)):
            if index in self.feature_layers:
                captured.append(hidden[0])
            attention, joined, norms = layer.self_attn, self.joined[index], self.norms[index]
            query, key, value = self._project(attention, joined, norms["input_layernorm"](hidden))  # (1, heads or kv_heads, n, d)
            query, key = self.rotate(query, key, *rotations[self.rotary_kinds[index]])
            # A cache held in another dtype or layout (hold_cache_in: a forward planned partly
            # native, on the bf16 build) is written and read in it; where the dtypes agree and
            # the keys are in rows these are no-ops.
            self.key_layout.write(keys, rows, key.to(keys.dtype))
            values.index_copy_(2, rows, value.to(values.dtype))
            mask = masks[self.sliding_windows[index]]
            cached_keys = self.key_layout.read(keys, window).to(query.dtype)
            cached_values = values[:, :, :window].to(query.dtype)
            attended = _attend(query, cached_keys, cached_values, mask, attention.scaling, self.attention_cap)
            attended = attention.o_proj(attended.transpose(1, 2).reshape(1, count, -1))
            if self.recipe.sandwich_norms:
                hidden = hidden + norms["post_attention_layernorm"](attended)
                hidden = hidden + norms["post_feedforward_layernorm"](joined_mlp(layer.mlp, joined, norms["pre_feedforward_layernorm"](hidden)))
            else:
                hidden = hidden + attended
                hidden = hidden + joined_mlp(layer.mlp, joined, norms["post_attention_layernorm"](hidden))
        final = self.final_norm(hidden)[0]  # (n, D)
        in_order = sorted(self.feature_layers)  # the order the loop met them
        features = torch.cat([captured[in_order.index(layer)] for layer in self.feature_layers], dim=-1) if captured else final[:, :0]
        logits = self.model.lm_head(final)  # (n, V)
        if self.logit_cap is not None:
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits, final, features

    def _project(
        self, attention: torch.nn.Module, joined: JoinedProjections, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of the normed input `x` (1, n, H), each (1, heads, n, d)."""
        count, head_dim, config = x.shape[1], attention.head_dim, self.model.config
        fused = attention.qkv_proj if self.recipe.fused_qkv else joined.qkv
        if fused is not None:
            widths = [config.num_attention_heads * head_dim] + [config.num_key_value_heads * head_dim] * 2
            query, key, value = fused(x).split(widths, dim=-1)
        else:
            query, key, value = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
        heads = (1, count, -1, head_dim)
        query, key, value = query.view(heads), key.view(heads), value.view(heads)  # (1, n, heads, d)
        if self.recipe.qk_norm:
            query, key = attention.q_norm(query), attention.k_norm(key)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def _rotations(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) by layer type (Gemma 3's local layers have their own base), else under None."""
        rotary = self.model.model.rotary_emb
        if not self.recipe.rotary_by_layer_type:
            return {None: rotary(hidden, positions[None])}
        return {kind: rotary(hidden, positions[None], kind) for kind in set(self.rotary_kinds)}

    def _masks(
        self, visible: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> dict[int | None, torch.Tensor]:
        """`_attend`'s mask by sliding window (None: the layers that see every position). A
        sliding layer's token sees the rows it sees anyway whose position is less than a
        window behind its own, the rule transformers' sliding masks follow."""
        masks = {None: _grouped_mask(visible, self.query_groups, dtype)}
        if self.row_positions is None:
            return masks
        self.row_positions.index_copy_(0, rows, positions)
        row_positions = self.row_positions[: visible.shape[1]]  # (window,)
        for size in {size for size in self.sliding_windows if size is not None}:
            recent = row_positions[None, :] > positions[:, None] - size  # (n, window)
            masks[size] = _grouped_mask(visible & recent, self.query_groups, dtype)
        return masks

    def move(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        for keys, values in self.cache:
            self.key_layout.move(keys, source, destination)
            # The right-hand side is gathered before the write, so overlaps are safe.
            values[:, :, destination] = values[:, :, source]
        if self.row_positions is not None:
            self.row_positions[destination] = self.row_positions[source]


def _grouped_mask(visible: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """`_attend`'s mask: `visible` (n, window) once per query group, as the additive mask SDPA
    would make of a boolean one (0 or -inf; no row is fully masked, since every token sees
    itself). Made once a forward rather than converted again by every layer."""
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    return additive.repeat(groups, 1)[None, None]  # (1, 1, groups * n, window)


def _attend(query, keys, values, mask, scale, cap=None):
    """query (1, heads, n, d) over keys and values (1, kv_heads, window, d): (1, heads, n, d).

    Query head h reads key/value head h // groups (transformers' `repeat_kv`). Each group's
    query heads are folded into the query length, one (groups * n)-row block per key/value
    head: no copy of the cache per group, and no `enable_gqa`, which with a mask sends CUDA
    to the slow math kernel rather than the memory-efficient one. With a soft cap (Gemma 2)
    the scores become cap * tanh(scores / cap) before the mask, which SDPA cannot do, so
    that attention is spelled out as transformers' eager attention computes it. On the CPU
    each token attends on its own (exact_attention.py): MKL sums a batch of query rows in
    another order than one row, and a verify must give each token a step's bits."""
    if query.device.type == "cpu":  # a token's bits must not depend on the batch (exact_attention.py)
        return exact_attention(query, keys, values, mask, scale, cap)
    _, heads, count, dim = query.shape
    kv_heads = keys.shape[1]
    folded = query.reshape(1, kv_heads, heads // kv_heads * count, dim)  # (1, kv_heads, groups * n, d)
    if cap is None:
        attended = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    else:
        scores = folded @ keys.transpose(2, 3) * scale  # (1, kv_heads, groups * n, window)
        scores = torch.tanh(scores / cap) * cap + mask
        attended = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype) @ values
    return attended.reshape(1, heads, count, dim)  # CUDA's kernels may hand back a transposed layout
