"""Weight-only int8 for torch models: 8-bit weights with one scale per output channel.

Why not bitsandbytes: its LLM.int8 layers cannot be captured in a CUDA graph and were the
slowest mode measured on an H100 (docs/BENCHMARKS.md). These layers are plain tensor ops,
so the graph-captured runtime runs them like any other layer, at about half bf16's weight
memory. Symmetric rounding to 127 levels per row is the same scheme as llama.cpp's Q8_0,
with one scale per row instead of one per 32 weights.

On a GPU each matmul is one Triton kernel that reads the int8 weight itself (int8_cuda.py),
or, where Triton cannot run, a matmul over a copy of the weight in the activations' dtype. On the CPU the
matmul is an integer one (int8_kernel.integer_product): the activations are rounded to int8
as well, in two levels, so that the product is as close to the float one as the weight's rounding
allows, and a token's row of the product is the same integers whatever else is in the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import int8_cuda
from .int4_weights import GROUP, Int4Linear
from .int8_kernel import integer_product, weight_row_sums


def quantise_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 per-row scale) with weight ≈ int8 * scale[:, None].

    The scales stay float32: rounded to bf16 (8 significant bits) a scale would be off by up
    to 0.4% for its whole row, the same way every call, on top of the int8 rounding."""
    rows = weight.detach().float()
    scale = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(rows / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        # For the CPU's int8 kernel (int8_kernel.py); rebuilt with the layer, never saved.
        self.register_buffer("row_sums", weight_row_sums(weight), persistent=False)
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        weight, scale = quantise_rows(linear.weight)
        return cls(weight, scale, linear.bias)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            flat = x.reshape(-1, x.shape[-1])
            product = integer_product(flat, self.weight, self.row_sums).reshape(*x.shape[:-1], -1)
        else:
            if int8_cuda.failure(x.device, x.dtype) is None:
                try:
                    return int8_cuda.linear(x, self.weight, self.scale, self.bias)
                except Exception as error:  # noqa: BLE001 -- a kernel that fails costs speed, not the reply
                    int8_cuda.give_up(x.device, x.dtype, error)
            product = F.linear(x, self.weight.to(x.dtype))
        # Scaled (and biased) in float32, then rounded once to the activations' dtype.
        out = product * self.scale  # (..., out) float32
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype)


@torch.no_grad()  # the biases are parameters: their joined copy must not carry autograd's graph
def join_rows(parts: list[Int8Linear]) -> Int8Linear:
    """One layer whose output is `parts`' outputs side by side, for layers that read the same
    input (a decoder's q, k and v; its gate and up projections): one matmul instead of
    several, for a third fewer calls per forward. The parts then read their rows of the joined
    weight as views, so the model holds no second copy and still runs part by part. Each
    output column is the same integer sum scaled the same way, so the joined layer gives the
    parts' outputs to the bit (on the CPU's integer matmul; a GPU's float matmul may sum a
    wider weight in another order). Join after the model has its device and dtype: a later
    `.to()` would copy the views apart and leave the joined weight behind."""
    if len({part.bias is None for part in parts}) > 1:
        raise ValueError("cannot join layers of which only some have a bias")
    bias = None if parts[0].bias is None else torch.cat([part.bias for part in parts])
    if _rows_of_one_tensor(parts):  # joined before (another runtime over the same model): share it
        return Int8Linear(parts[0].weight._base, parts[0].scale._base, bias)
    weight = torch.cat([part.weight for part in parts])  # (sum of outs, in)
    scale = torch.cat([part.scale for part in parts])
    start = 0
    for part in parts:
        stop = start + part.out_features
        part.weight, part.scale = weight[start:stop], scale[start:stop]
        start = stop
    return Int8Linear(weight, scale, bias)


def _rows_of_one_tensor(parts: list[Int8Linear]) -> bool:
    """Whether `parts` are, in order, all the rows of one weight and one scale tensor."""
    weight, scale = parts[0].weight._base, parts[0].scale._base
    if weight is None or scale is None or weight.shape[0] != sum(part.out_features for part in parts):
        return False
    row = 0
    for part in parts:
        if part.weight._base is not weight or part.scale._base is not scale:
            return False
        if part.weight.data_ptr() != weight[row].data_ptr() or part.scale.data_ptr() != scale[row].data_ptr():
            return False
        row += part.out_features
    return True


class Int8Embedding(nn.Module):
    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        weight, scale = quantise_rows(embedding.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.padding_idx = embedding.padding_idx
        # The compute dtype of the layers it feeds, kept as an empty buffer so that the
        # model's .to(dtype) moves it along with them.
        self.register_buffer("compute_dtype", torch.empty(0, dtype=embedding.weight.dtype, device=embedding.weight.device), persistent=False)
        # Gemma's embedding module multiplies its rows by sqrt(hidden size), rounded to the
        # weights' dtype as it does; the quantised table keeps that factor.
        embed_scale = getattr(embedding, "embed_scale", None)
        self.register_buffer("embed_scale", None if embed_scale is None else embed_scale.to(embedding.weight.dtype), persistent=False)

    def dequantised(self) -> torch.Tensor:
        """The whole (V, H) table as values in the compute dtype (without Gemma's factor,
        as nn.Embedding's weight is)."""
        return (self.weight.float() * self.scale[:, None]).to(self.compute_dtype.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.weight).float() * self.scale[ids, None]  # (..., H) float32
        rows = rows.to(self.compute_dtype.dtype)
        return rows if self.embed_scale is None else rows * self.embed_scale


def quantise_weight_only(model: nn.Module, bits: int = 8) -> nn.Module:
    """Replace every linear layer and the input embeddings of a causal LM in place by int8
    ones, or with bits=4 every linear layer but the output head by an int4 one (int4_weights.py;
    one whose inputs are not whole groups of 32 stays int8). A tied output head shares the
    embedding's int8 table (same rows, same scales)."""
    if bits not in (4, 8):
        raise ValueError(f"weight-only layers of 4 or 8 bits, not {bits}")
    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child is not head:
                    four = bits == 4 and child.in_features % GROUP == 0
                    setattr(parent, name, Int4Linear.from_linear(child) if four else Int8Linear.from_linear(child))
        quantised_embeddings = Int8Embedding(embeddings)
        model.set_input_embeddings(quantised_embeddings)
        if tied:
            model.set_output_embeddings(Int8Linear(quantised_embeddings.weight, quantised_embeddings.scale, None))
        elif head is not None:
            model.set_output_embeddings(Int8Linear.from_linear(head))
    model.config.tie_word_embeddings = False  # the int8 modules share storage themselves
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct parameter and buffer tensor (shared storage counted once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total
