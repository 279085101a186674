"""An EAGLE-3 head's decoder layer and LM head in one C call (`tandem_eagle3_forward` in
decoder_forward.c), with int8 weights, over the head's own KV cache (float32, or bf16 where
the kernel build's attention multiplies in bf16).

Why: a drafted token must cost little next to the target step it saves. In torch the head
took 3.2 ms a call in bf16 on the 2-core development CPU, about what a whole step of the demo
target costs on the native forward (3.4 ms), so no acceptance could make it pay there. In C it
is one pass over 10 MB of int8 weights and a few loops (docs/BENCHMARKS.md, "A native EAGLE-3
head").

The weights are rounded to int8 per row, as `int8_weights` rounds a target's, and the int8
kernel rounds the activations in two levels: the drafts differ from the torch head's by that
rounding, and exactness never depends on them (the target verifies every drafted token).
"""
from __future__ import annotations

import ctypes

import torch

from . import int8_kernel
from .cpu import forward_threads
from .eagle3_head import Eagle3Head
from .int8_weights import Int8Linear, join_rows, quantise_rows
from .native_forward import DecoderStruct, LayerStruct, cache_dtype, int8_struct, key_layout

GROWTH = 256  # cache rows (and rotary positions) added at a time
# Tokens per C call: a long prompt is read in pieces, as the target's native forward reads it
# (native_forward.PROMPT_ROWS), so attention's scratch (heads x tokens x cached rows floats)
# stays small.
PIECE_ROWS = 64
QUANTISE_ROWS = 8192  # embedding rows rounded at a time: no float copy of a whole large table


def native_head_refusal(head: Eagle3Head, embeddings: torch.Tensor) -> str | None:
    """Why `head` cannot run in C; None when it can."""
    config = head.config
    if config.head_dim % 2 or config.head_dim > 512 or config.num_attention_heads % config.num_key_value_heads:
        return (f"the native head runs even heads of at most 512 and whole query groups "
                f"(head_dim {config.head_dim}, {config.num_attention_heads}/{config.num_key_value_heads} heads)")
    if embeddings.device.type != "cpu":
        return "the native head runs on the CPU, and the target's embeddings are on another device"
    if embeddings.dim() != 2 or embeddings.shape[1] != config.hidden_size:
        return f"the token embeddings are {tuple(embeddings.shape)}, not {config.hidden_size} wide as the head"
    return int8_kernel.unavailable_reason()


class NativeHeadLayer:
    """The head's layer as `Eagle3Runtime` runs it: `fuse` the target's features, `run` new
    tokens over the cache, `keep` the slots that stay."""

    dtype = torch.float32  # of the features and outputs it takes and gives

    def __init__(self, head: Eagle3Head, embeddings: torch.Tensor):
        config = head.config
        self.config = config
        self.library = int8_kernel.loaded_library()
        layer = head.midlayer
        with torch.no_grad():
            self.fc = Int8Linear.from_linear(head.fc)
            attention, mlp = layer.self_attn, layer.mlp
            self._qkv = join_rows([Int8Linear.from_linear(attention.q_proj), Int8Linear.from_linear(attention.k_proj),
                                   Int8Linear.from_linear(attention.v_proj)])
            self._gate_up = join_rows([Int8Linear.from_linear(mlp.gate_proj), Int8Linear.from_linear(mlp.up_proj)])
            self._output = Int8Linear.from_linear(attention.o_proj)
            self._down = Int8Linear.from_linear(mlp.down_proj)
            self._lm_head = Int8Linear.from_linear(head.lm_head)
            pieces = [quantise_rows(embeddings[first:first + QUANTISE_ROWS]) for first in range(0, len(embeddings), QUANTISE_ROWS)]
            self._embedding = torch.cat([weight for weight, _ in pieces])
            self._embedding_scale = torch.cat([scale for _, scale in pieces])
            self._norms = [norm.weight.detach().float().contiguous() for norm in
                           (layer.input_layernorm, layer.post_attention_layernorm, layer.hidden_norm, head.norm)]
        self._inverse_frequencies = head.inv_freq.float()
        self._key_layout = key_layout()
        self._keys: torch.Tensor | None = None  # in the kernel build's layout (key_blocks.py)
        self._values: torch.Tensor | None = None
        self._cos = self._sin = torch.zeros(0)
        self._decoder: DecoderStruct | None = None
        self._keep: list = []
        self._grow(GROWTH)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(n, 3·H_target) target features -> (n, H) float32, by `fc` in int8."""
        return self.fc(features.float().contiguous())

    def run(
        self, start: int, ids: list[int], inputs: torch.Tensor, positions: list[int], visible: torch.Tensor, logits_wanted: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens `ids` at `positions` with input features `inputs` (T, H) write cache slots
        start.. and see the slots `visible` (T, start + T) marks. Returns their layer outputs
        (T, H) and the draft-vocabulary logits of the last `logits_wanted`."""
        count = len(ids)
        self._grow(max(start + count, max(positions) + 1))
        visible = visible.to(torch.bool)
        inputs = inputs.float()
        outputs = torch.empty(count, self.config.hidden_size)
        logits = torch.empty(logits_wanted, self.config.draft_vocab_size)
        wanted_from = count - logits_wanted
        for first in range(0, count, PIECE_ROWS):
            last = min(first + PIECE_ROWS, count)
            piece_wanted_from = min(max(wanted_from - first, 0), last - first)
            self._run_piece(
                start + first, ids[first:last], inputs[first:last].contiguous(), positions[first:last],
                visible[first:last, : start + last].contiguous(), piece_wanted_from,
                logits[max(first - wanted_from, 0):], outputs[first:last],
            )
        return outputs, logits

    def _run_piece(
        self, start: int, ids: list[int], inputs: torch.Tensor, positions: list[int], visible: torch.Tensor, wanted_from: int,
        logits: torch.Tensor, outputs: torch.Tensor,
    ) -> None:
        """One C call: its logits into the first rows of `logits`, its outputs into `outputs`
        (both contiguous views the call writes through)."""
        count = len(ids)
        status = self.library.tandem_eagle3_forward(
            ctypes.byref(self._decoder), self._norms[2].data_ptr(), count, (ctypes.c_int64 * count)(*ids), inputs.data_ptr(),
            (ctypes.c_int64 * count)(*positions), (ctypes.c_int64 * count)(*range(start, start + count)), visible.data_ptr(),
            visible.shape[1], 0, visible.shape[1], wanted_from, logits.data_ptr(), outputs.data_ptr(),
            forward_threads(),
        )
        if status == -1:
            raise MemoryError("out of memory for the EAGLE-3 head's activations")
        if status != 0:
            raise ValueError("the EAGLE-3 head was given tokens, positions or cache slots outside its own")

    def keep(self, kept: list[int]) -> None:
        """Slots `kept` (ascending, in the new order) become slots 0.. of the cache."""
        index = torch.tensor(kept)
        self._key_layout.move(self._keys, index, torch.arange(len(kept)))
        self._values[:, : len(kept)] = self._values[:, index]

    def _grow(self, rows: int) -> None:
        """A cache (and a rotary table) of at least `rows` rows; the C view follows them."""
        layout = self._key_layout
        capacity = 0 if self._keys is None else layout.rows(self._keys)
        if rows <= capacity:
            return
        config = self.config
        capacity = layout.rounded(max(capacity + GROWTH, rows))
        keys = layout.zeros((config.num_key_value_heads,), capacity, config.head_dim, cache_dtype())
        values = torch.zeros(config.num_key_value_heads, capacity, config.head_dim, dtype=cache_dtype())
        if self._keys is not None:
            layout.copy_rows(self._keys, keys)
            values[:, : self._values.shape[1]] = self._values
        self._keys, self._values = keys, values
        angles = torch.arange(capacity).float()[:, None] * self._inverse_frequencies  # (rows, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos, self._sin = angles.cos().contiguous(), angles.sin().contiguous()
        self._build_view(capacity)

    def _build_view(self, capacity: int) -> None:
        config, norms, keep = self.config, self._norms, []
        layers = (LayerStruct * 1)()
        layers[0] = LayerStruct(norms[0].data_ptr(), norms[1].data_ptr(), int8_struct(self._qkv, keep),
                                int8_struct(self._output, keep), int8_struct(self._gate_up, keep), int8_struct(self._down, keep),
                                self._keys.data_ptr(), self._values.data_ptr(), None, None)
        self._decoder = DecoderStruct(
            1, config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.intermediate_size, self._embedding.shape[0], capacity, float(config.rms_norm_eps),
            float(config.head_dim ** -0.5), self._embedding.data_ptr(), self._embedding_scale.data_ptr(), norms[3].data_ptr(),
            int8_struct(self._lm_head, keep), self._cos.data_ptr(), self._sin.data_ptr(), capacity, layers,
        )
        # Every tensor whose address the view holds (the call releases the GIL).
        self._keep = keep + [layers, norms, self._embedding, self._embedding_scale, self._keys, self._values, self._cos, self._sin]
