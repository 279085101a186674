"""Weight-only int8 for torch models: 8-bit weights with one scale per output channel,
dequantised inside each matmul (on the CPU by torch's fused int8 kernel), activations left
in bf16.

Why not bitsandbytes: its LLM.int8 layers cannot be captured in a CUDA graph and were the
slowest mode measured on an H100 (docs/BENCHMARKS.md). These layers are plain tensor ops,
so the graph-captured runtime runs them like any other layer, at about half bf16's weight
memory. Symmetric rounding to 127 levels per row is the same scheme as llama.cpp's Q8_0,
with one scale per row instead of one per 32 weights.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
        self.bias = bias
        # The fused kernel below takes a scale per row in the activations' dtype; it gets
        # ones, and the float32 scale is applied after, as on the other path.
        self.register_buffer("unit_scale", torch.ones(weight.shape[0], dtype=torch.bfloat16, device=weight.device), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        weight, scale = quantise_rows(linear.weight)
        return cls(weight, scale, linear.bias)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.bfloat16:
            # The fused int8 matmul reads the int8 weight as it is, where F.linear below first
            # copies it to bf16: the demo target's forward 19.8 ms against 59.3 on the 2-core
            # CPU (docs/BENCHMARKS.md, the torch.compile probe). Both give the bf16 product of
            # x and the int8 rows.
            flat = x.reshape(-1, x.shape[-1]).contiguous()
            product = torch._weight_int8pack_mm(flat, self.weight, self.unit_scale).reshape(*x.shape[:-1], -1)
        else:
            product = F.linear(x, self.weight.to(x.dtype))
        # Scaled (and biased) in float32, then rounded once to the activations' dtype.
        out = product * self.scale  # (..., out) float32
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype)


class Int8Embedding(nn.Module):
    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        weight, scale = quantise_rows(embedding.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.padding_idx = embedding.padding_idx
        self.output_dtype = embedding.weight.dtype  # the compute dtype of the layers it feeds
        # Gemma's embedding module multiplies its rows by sqrt(hidden size), rounded to the
        # weights' dtype as it does; the quantised table keeps that factor.
        embed_scale = getattr(embedding, "embed_scale", None)
        self.register_buffer("embed_scale", None if embed_scale is None else embed_scale.to(self.output_dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.weight).float() * self.scale[ids, None]  # (..., H) float32
        rows = rows.to(self.output_dtype)
        return rows if self.embed_scale is None else rows * self.embed_scale


def quantise_weight_only(model: nn.Module) -> nn.Module:
    """Replace every linear layer and the input embeddings of a causal LM in place by int8
    ones. A tied output head shares the embedding's int8 table (same rows, same scales)."""
    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child is not head:
                    setattr(parent, name, Int8Linear.from_linear(child))
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
