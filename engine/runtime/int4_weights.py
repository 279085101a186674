"""Weight-only int4 for torch models on the CPU: 4-bit weights with a bf16 scale per 32 inputs
(the `int4-wo` precision).

Why: a step of a 1-8B model on a CPU is bound by reading its weights, and people run such models
as 4-bit GGUF files (Q4_K_M, Q4_0), which llama.cpp reads at about 4.5-4.8 bits a weight. The
int8 layers (int8_weights.py) read 8: on the 1.7B and 8B shapes Tandem's plain decoding wrote
0.67-0.75x llama-bench's on Q4_K_M files (docs/BENCHMARKS.md). These layers read 4.5 bits a
weight, Q4_0's scheme: 16 levels per group of 32 weights, the group's largest-magnitude weight
at level -8, one scale per group.

The product (`int4_matmul.c`; `reference_product` here, the same arithmetic in torch) rounds each
activation row to int8 per group of 32 as llama.cpp's Q8_0 does, sums each group in integers
and adds the groups up in float32 in order. A row's output never depends on the rows batched with
it, so a verify gives each token the logits a one-token step gives it, as with int8.

The embedding table and the output head stay int8 (Q4_K_M keeps its output head at 6 bits too):
the head decides every token, and it is a small part of a 1-8B model's bytes.

The packed layout the C code reads, weight rows in blocks of 16 (the last padded with zeros):
block b, group g is 256 bytes, 4 vectors of 64; in vector v, bytes 4r..4r+3 belong to row
16b + r: byte i's low nibble is input 32g + 8v + i, its high nibble input 32g + 8v + 4 + i, each
stored as level + 8. The scales: block b, group g, row r, as bf16 bits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP = 32  # inputs per scale
BLOCK_ROWS = 16  # rows packed together


def quantise_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(levels int8 in [-8, 7] (n, k), bf16 scales (n, k / 32)) with weight ≈ levels * scale per
    group. Each group's largest-magnitude weight goes to level -8 (so 16 levels are used, not
    15). The scale is rounded to bf16 first, and the levels are rounded at the rounded scale."""
    rows, width = weight.shape
    if width % GROUP:
        raise ValueError(f"int4 weights need inputs in whole groups of {GROUP}, not {width}")
    groups = weight.detach().float().reshape(rows, width // GROUP, GROUP)
    largest = groups.gather(2, groups.abs().argmax(dim=2, keepdim=True))  # signed, (n, G, 1)
    scale = (largest / -8.0).to(torch.bfloat16)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    levels = torch.round(groups / divisor).clamp(-8, 7).to(torch.int8)
    return levels.reshape(rows, width), scale.reshape(rows, width // GROUP)


def pack(levels: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout (module docstring) of `quantise_groups`' levels and scales:
    (uint8 (blocks, G, 4, 16, 4), int16 bf16 bits (blocks, G, 16))."""
    rows, width = levels.shape
    blocks, groups = -(-rows // BLOCK_ROWS), width // GROUP
    padded = torch.zeros(blocks * BLOCK_ROWS, width, dtype=torch.uint8)
    padded[:rows] = (levels.to(torch.int16) + 8).to(torch.uint8)
    # (block, row, group, vector, half, i) -> (block, group, vector, row, i) for each half
    nibbles = padded.reshape(blocks, BLOCK_ROWS, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
    packed = (nibbles[..., 0, :] | (nibbles[..., 1, :] << 4)).contiguous()
    scale_rows = torch.zeros(blocks * BLOCK_ROWS, groups, dtype=torch.bfloat16)
    scale_rows[:rows] = scales
    packed_scales = scale_rows.reshape(blocks, BLOCK_ROWS, groups).transpose(1, 2).contiguous().view(torch.int16)
    return packed, packed_scales


def unpack(packed: torch.Tensor, packed_scales: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack`'s inverse: (levels (rows, k) int8, scales (rows, k / 32) bf16)."""
    blocks, groups = packed.shape[:2]
    halves = torch.stack([packed & 0x0F, packed >> 4], dim=-2)  # (block, group, vector, row, half, i)
    levels = halves.permute(0, 3, 1, 2, 4, 5).reshape(blocks * BLOCK_ROWS, groups * GROUP)[:rows]
    scales = packed_scales.view(torch.bfloat16).transpose(1, 2).reshape(blocks * BLOCK_ROWS, groups)[:rows]
    return (levels.to(torch.int16) - 8).to(torch.int8), scales


def round_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x (m, k) float32 rounded per group of 32 to int8: (levels (m, G, 32) as float32,
    scales (m, G)). The scale is the group's largest |value| / 127 (at least 1e-30), NaN where
    a value is NaN (its levels are then 0); levels are x times the scale's reciprocal, rounded
    half to even. int4_matmul.c's round_groups does the same float32 operations."""
    groups = x.reshape(x.shape[0], -1, GROUP)
    largest = groups.abs().amax(dim=2)
    any_nan = groups.isnan().any(dim=2)
    scale = largest.clamp(min=1e-30) / 127.0
    levels = torch.round(groups * (1.0 / scale)[..., None])
    levels = torch.where(any_nan[..., None], torch.zeros_like(levels), levels)
    return levels, torch.where(any_nan, torch.full_like(scale, float("nan")), scale)


def reference_product(x: torch.Tensor, levels: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (m, k) times the int4 weight (levels (n, k), bf16 scales (n, G)) transposed, in float32:
    what int4_matmul.c computes, to the bit. Each group's integer sum is exact in float64 (at most
    32 x 8 x 127), then the groups are added in order as the C code adds them."""
    activations, activation_scales = round_groups(x.float())
    rows, width = levels.shape
    weight_groups = levels.double().reshape(rows, width // GROUP, GROUP)
    sums = torch.einsum("mgi,ngi->mgn", activations.double(), weight_groups).float()  # (m, G, n), exact
    weight_scales = scales.float()  # (n, G)
    total = torch.zeros(x.shape[0], rows)
    for g in range(width // GROUP):
        total = total + sums[:, g, :] * (weight_scales[:, g][None, :] * activation_scales[:, g][:, None])
    return total


class Int4Linear(nn.Module):
    """A linear layer with int4 weights in the kernel's packed layout (and an optional float bias)."""

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, rows: int, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.rows = rows
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int4Linear":
        packed, scales = pack(*quantise_groups(linear.weight))
        return cls(packed, scales, linear.weight.shape[0], linear.bias)

    @property
    def out_features(self) -> int:
        return self.rows

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * GROUP

    def levels_and_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        return unpack(self.packed, self.scales, self.rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if x.device.type == "cpu":
            from .int8_kernel import int4_product  # the library loader, which imports this module's layout

            out = int4_product(flat.float(), self)
        else:  # another device: the weight as floats, then a float matmul
            levels, scales = self.levels_and_scales()
            weight = (levels.float().reshape(self.rows, -1, GROUP) * scales.float()[..., None]).reshape(self.rows, -1)
            out = F.linear(flat.float(), weight.to(flat.device))
        if self.bias is not None:
            out = out + self.bias.float()
        return out.reshape(*x.shape[:-1], -1).to(x.dtype)


@torch.no_grad()
def join_rows(parts: list[Int4Linear]) -> Int4Linear:
    """One layer whose output is `parts`' outputs side by side (int8_weights.join_rows says why).
    Where every part has whole blocks of rows, the parts then read their blocks of the joined
    weight as views, so the model holds no second copy; otherwise the joined layer is a copy."""
    if len({part.bias is None for part in parts}) > 1:
        raise ValueError("cannot join layers of which only some have a bias")
    bias = None if parts[0].bias is None else torch.cat([part.bias for part in parts])
    rows = sum(part.rows for part in parts)
    if any(part.rows % BLOCK_ROWS for part in parts):
        pairs = [part.levels_and_scales() for part in parts]
        packed, scales = pack(torch.cat([levels for levels, _ in pairs]), torch.cat([scales for _, scales in pairs]))
        return Int4Linear(packed, scales, rows, bias)
    if parts[0].packed._base is not None and _blocks_of_one_tensor(parts):  # joined before: share it
        return Int4Linear(parts[0].packed._base, parts[0].scales._base, rows, bias)
    packed = torch.cat([part.packed for part in parts])
    scales = torch.cat([part.scales for part in parts])
    start = 0
    for part in parts:
        stop = start + part.packed.shape[0]
        part.packed, part.scales = packed[start:stop], scales[start:stop]
        start = stop
    return Int4Linear(packed, scales, rows, bias)


def _blocks_of_one_tensor(parts: list[Int4Linear]) -> bool:
    packed, scales = parts[0].packed._base, parts[0].scales._base
    if scales is None or packed.shape[0] != sum(part.packed.shape[0] for part in parts):
        return False
    block = 0
    for part in parts:
        if part.packed._base is not packed or part.scales._base is not scales:
            return False
        if part.packed.data_ptr() != packed[block].data_ptr() or part.scales.data_ptr() != scales[block].data_ptr():
            return False
        block += part.packed.shape[0]
    return True
