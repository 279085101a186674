"""Weight-only int4 for torch models on the CPU: 4-bit weights with a scale and a minimum per 32
inputs, coded in 8 bits against two bf16 factors per 256 (the `int4-wo` precision).

Why: a step of a 1-8B model on a CPU is bound by reading its weights, and people run such models
as 4-bit GGUF files (Q4_K_M, Q4_0), which llama.cpp reads at about 4.5-5 bits a weight. The
int8 layers (int8_weights.py) read 8: on the 1.7B and 8B shapes Tandem's plain decoding wrote
0.67-0.75x llama-bench's on Q4_K_M files (docs/BENCHMARKS.md). These layers read 4.625 bits a
weight, Q4_K's scheme with 8-bit codes: 16 levels per group of 32 weights from the group's
smallest weight to its largest; the group's scale is an 8-bit code times its super-block's bf16
scale factor, and its minimum a signed 8-bit code times the super-block's bf16 minimum factor (a
super-block: 8 groups, 256 inputs). (A bf16 scale and minimum per group, Q4_1's scheme, read 5
bits a weight, 8% more, and kept the demo target's next token a little more often, 96.75% of
the time: its weights come from a Q4_1 file, which that scheme reproduces almost exactly. On
weights that were never 4-bit, both schemes make the same error; docs/BENCHMARKS.md. Q4_0's
symmetric levels kept the demo target's next token 70% of the time.)

The product (`int4_matmul.c`; `reference_product` here, the same arithmetic in torch) rounds each
activation row to int8 per group of 32 as llama.cpp does for its 4-bit files, sums each group in
integers and adds the groups up in float32 in order. A row's output never depends on the rows batched with
it, so a verify gives each token the logits a one-token step gives it, as with int8.

The embedding table and the output head stay int8 (Q4_K_M keeps its output head at 6 bits too):
the head decides every token, and it is a small part of a 1-8B model's bytes.

The packed layout the C code reads, weight rows in blocks of 16 (the last padded with zeros):
block b, group g is 256 bytes, 4 vectors of 64; in vector v, bytes 4r..4r+3 belong to row
16b + r: byte i's low nibble is input 32g + 8v + i, its high nibble input 32g + 8v + 4 + i. The
scales, block b's bytes, super-block by super-block: the 16 rows' bf16 scale factors, their 16
bf16 minimum factors (64 bytes), then for each of its groups the 16 rows' scale codes (uint8)
and their 16 minimum codes (int8), 32 bytes. The last super-block of a row may have fewer groups.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import int8_kernel  # the library loader (the int4 product is built into the same library)
from .cpu import forward_threads

GROUP = 32  # inputs per scale
BLOCK_ROWS = 16  # rows packed together
SUPER_GROUPS = 8  # groups whose codes share a super-block's two bf16 factors
SCALE_CODES, MINIMUM_CODES = 255, 127  # the largest scale code; minimum codes run from -127 to 127
FACTOR_BYTES, CODE_BYTES = 4 * BLOCK_ROWS, 2 * BLOCK_ROWS  # a block's bytes per super-block and per group


class Int4Weight(NamedTuple):
    """A weight (n, k) as levels and coded scales; group g's scale is
    super_scales[:, g // 8] x scale_codes[:, g], its minimum super_minimums[:, g // 8] x
    minimum_codes[:, g], each one float32 multiply, as the C code does."""

    levels: torch.Tensor  # uint8 in [0, 15] (n, k)
    scale_codes: torch.Tensor  # uint8 (n, G)
    minimum_codes: torch.Tensor  # int8 in [-127, 127] (n, G)
    super_scales: torch.Tensor  # bf16 (n, S), S = G / 8 rounded up
    super_minimums: torch.Tensor  # bf16 (n, S)

    def scales(self) -> torch.Tensor:
        """Each group's scale, float32 (n, G)."""
        return _per_group(self.super_scales, self.scale_codes.shape[1]) * self.scale_codes.float()

    def minimums(self) -> torch.Tensor:
        """Each group's minimum, float32 (n, G)."""
        return _per_group(self.super_minimums, self.minimum_codes.shape[1]) * self.minimum_codes.float()


def _per_group(factors: torch.Tensor, groups: int) -> torch.Tensor:
    return factors.float().repeat_interleave(SUPER_GROUPS, dim=1)[:, :groups]


def _code_factor(values: torch.Tensor, largest_code: int) -> torch.Tensor:
    """A bf16 factor per super-block (n, S) for values (n, S, 8): their largest |value| over
    `largest_code` (1 where they are all 0)."""
    factor = (values.abs().amax(dim=2) / largest_code).to(torch.bfloat16)
    return torch.where(factor == 0, torch.ones_like(factor), factor)


def quantise_groups(weight: torch.Tensor) -> Int4Weight:
    """`weight` (n, k) with 16 levels per group of 32, from the group's smallest weight (level 0)
    to its largest (15). Scale and minimum are coded first, and the levels rounded against the
    coded ones."""
    rows, width = weight.shape
    if width % GROUP:
        raise ValueError(f"int4 weights need inputs in whole groups of {GROUP}, not {width}")
    count = width // GROUP
    groups = weight.detach().float().reshape(rows, count, GROUP)
    smallest, largest = groups.amin(dim=2), groups.amax(dim=2)
    supers = -(-count // SUPER_GROUPS)
    padding = supers * SUPER_GROUPS - count  # a short last super-block, padded with zeros to code it

    def coded(values: torch.Tensor, largest_code: int, smallest_code: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = F.pad(values, (0, padding)).reshape(rows, supers, SUPER_GROUPS)
        factor = _code_factor(blocks, largest_code)
        codes = torch.round(blocks / factor.float()[..., None]).clamp(smallest_code, largest_code)
        return codes.reshape(rows, -1)[:, :count], factor

    scale_codes, super_scales = coded((largest - smallest) / 15.0, SCALE_CODES, 0)
    minimum_codes, super_minimums = coded(smallest, MINIMUM_CODES, -MINIMUM_CODES)
    weight_of = Int4Weight(torch.empty(0), scale_codes.to(torch.uint8), minimum_codes.to(torch.int8), super_scales, super_minimums)
    scale, minimum = weight_of.scales(), weight_of.minimums()
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)
    levels = torch.round((groups - minimum[..., None]) / divisor[..., None]).clamp(0, 15).to(torch.uint8)
    return weight_of._replace(levels=levels.reshape(rows, width))


def pack(weight: Int4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout (module docstring) of `weight`: (uint8 (blocks, G, 4, 16, 4), the
    scales' bytes, uint8 (blocks, 64 S + 32 G))."""
    rows, width = weight.levels.shape
    blocks, groups, supers = -(-rows // BLOCK_ROWS), width // GROUP, weight.super_scales.shape[1]
    padded = torch.zeros(blocks * BLOCK_ROWS, width, dtype=torch.uint8)
    padded[:rows] = weight.levels
    # (block, row, group, vector, half, i) -> (block, group, vector, row, i) for each half
    nibbles = padded.reshape(blocks, BLOCK_ROWS, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
    packed = (nibbles[..., 0, :] | (nibbles[..., 1, :] << 4)).contiguous()
    factors = torch.zeros(blocks * BLOCK_ROWS, supers, 2, dtype=torch.bfloat16)
    factors[:rows, :, 0], factors[:rows, :, 1] = weight.super_scales, weight.super_minimums
    factor_bytes = factors.reshape(blocks, BLOCK_ROWS, supers, 2).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
    codes = torch.zeros(blocks * BLOCK_ROWS, groups, 2, dtype=torch.uint8)
    codes[:rows, :, 0], codes[:rows, :, 1] = weight.scale_codes, weight.minimum_codes.view(torch.uint8)
    code_bytes = codes.reshape(blocks, BLOCK_ROWS, groups, 2).permute(0, 2, 3, 1)  # (block, group, scale|minimum, row)
    pieces = []
    for first in range(0, groups, SUPER_GROUPS):
        pieces.append(factor_bytes[:, first // SUPER_GROUPS].reshape(blocks, FACTOR_BYTES))
        pieces.append(code_bytes[:, first : first + SUPER_GROUPS].reshape(blocks, -1))
    return packed, torch.cat(pieces, dim=1)


def unpack(packed: torch.Tensor, scale_bytes: torch.Tensor, rows: int) -> Int4Weight:
    """`pack`'s inverse."""
    blocks, groups = packed.shape[:2]
    halves = torch.stack([packed & 0x0F, packed >> 4], dim=-2)  # (block, group, vector, row, half, i)
    levels = halves.permute(0, 3, 1, 2, 4, 5).reshape(blocks * BLOCK_ROWS, groups * GROUP)[:rows]
    factors, codes, offset = [], [], 0
    for first in range(0, groups, SUPER_GROUPS):
        count = min(SUPER_GROUPS, groups - first)
        factors.append(scale_bytes[:, offset : offset + FACTOR_BYTES].reshape(blocks, 1, FACTOR_BYTES))
        codes.append(scale_bytes[:, offset + FACTOR_BYTES : offset + FACTOR_BYTES + count * CODE_BYTES].reshape(blocks, count, CODE_BYTES))
        offset += FACTOR_BYTES + count * CODE_BYTES
    # (block, super, scale|minimum, row) -> (row, super, scale|minimum)
    factor_rows = torch.cat(factors, dim=1).contiguous().view(torch.bfloat16).reshape(blocks, -1, 2, BLOCK_ROWS)
    factor_rows = factor_rows.permute(0, 3, 1, 2).reshape(blocks * BLOCK_ROWS, -1, 2)[:rows]
    code_rows = torch.cat(codes, dim=1).reshape(blocks, groups, 2, BLOCK_ROWS).permute(0, 3, 1, 2)
    code_rows = code_rows.reshape(blocks * BLOCK_ROWS, groups, 2)[:rows]
    return Int4Weight(levels, code_rows[..., 0].contiguous(), code_rows[..., 1].contiguous().view(torch.int8),
                      factor_rows[..., 0].contiguous(), factor_rows[..., 1].contiguous())


def dequantised(weight: Int4Weight) -> torch.Tensor:
    """The weight the levels stand for, float32 (n, k)."""
    rows = weight.levels.shape[0]
    groups = weight.levels.float().reshape(rows, -1, GROUP) * weight.scales()[..., None] + weight.minimums()[..., None]
    return groups.reshape(rows, -1)


def round_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows x (m, k) float32 rounded per group of 32 to int8: (levels (m, G, 32) as float32,
    scales (m, G), scale x the levels' sum (m, G)). The scale is the group's largest |value| /
    127 (at least 1e-30), NaN where a value is NaN (its levels are then 0); levels are x times
    the scale's reciprocal, rounded half to even. int4_matmul.c's round_groups does the same
    float32 operations."""
    groups = x.reshape(x.shape[0], -1, GROUP)
    largest = groups.abs().amax(dim=2)
    any_nan = groups.isnan().any(dim=2)
    scale = largest.clamp(min=1e-30) / 127.0
    levels = torch.round(groups * (1.0 / scale)[..., None])
    levels = torch.where(any_nan[..., None], torch.zeros_like(levels), levels)
    scale = torch.where(any_nan, torch.full_like(scale, float("nan")), scale)
    return levels, scale, scale * levels.sum(dim=2)


def reference_product(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """x (m, k) times the int4 weight transposed, in float32: what int4_matmul.c computes, to the
    bit. Each group's integer sum is exact in float64 (at most 32 x 15 x 127); per group, its sum
    times (weight scale x activation scale), plus the weight's minimum times (activation scale x
    the levels' sum), added to the total in group order, as the C code does."""
    activations, activation_scales, level_sums = round_groups(x.float())
    rows, width = weight.levels.shape
    weight_groups = weight.levels.double().reshape(rows, width // GROUP, GROUP)
    sums = torch.einsum("mgi,ngi->mgn", activations.double(), weight_groups).float()  # (m, G, n), exact
    weight_scales, weight_minimums = weight.scales(), weight.minimums()  # (n, G)
    total = torch.zeros(x.shape[0], rows)
    for g in range(width // GROUP):
        part = sums[:, g, :] * (weight_scales[:, g][None, :] * activation_scales[:, g][:, None])
        part = part + weight_minimums[:, g][None, :] * level_sums[:, g][:, None]
        total = total + part
    return total


def int4_product(x: torch.Tensor, layer: "Int4Linear") -> torch.Tensor:
    """x (m, k) float32 times `layer`'s weight transposed, in float32: by the kernel's
    `tandem_int4_linear` where the library runs, else by `reference_product` (the same floats,
    slower)."""
    library = int8_kernel.loaded_library()
    if library is None:
        return reference_product(x, layer.unpacked())
    if not (x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == layer.in_features):
        raise ValueError(f"the int4 product takes float32 rows of width {layer.in_features}, not {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty((x.shape[0], layer.rows), dtype=torch.float32)
    failed = library.tandem_int4_linear(
        x.data_ptr(), x.shape[0], x.shape[1], layer.packed.data_ptr(), layer.scales.data_ptr(), layer.rows, None,
        out.data_ptr(), None, None, forward_threads(),
    )
    if failed:
        raise MemoryError("out of memory for the int4 product's rounded activations")
    return out


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
        packed, scales = pack(quantise_groups(linear.weight))
        return cls(packed, scales, linear.weight.shape[0], linear.bias)

    @property
    def out_features(self) -> int:
        return self.rows

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * GROUP

    def unpacked(self) -> Int4Weight:
        """The weight as `quantise_groups` gives it."""
        return unpack(self.packed, self.scales, self.rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if x.device.type == "cpu":
            out = int4_product(flat.float(), self)
        else:  # another device: the weight as floats, then a float matmul
            out = F.linear(flat.float(), dequantised(self.unpacked()).to(flat.device))
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
        unpacked = [part.unpacked() for part in parts]
        packed, scales = pack(Int4Weight(*(torch.cat(tensors) for tensors in zip(*unpacked))))
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
