"""Weight-only int4 for torch models on the CPU: 4-bit weights with a bf16 scale and minimum per
32 inputs (the `int4-wo` precision).

Why: a step of a 1-8B model on a CPU is bound by reading its weights, and people run such models
as 4-bit GGUF files (Q4_K_M, Q4_0), which llama.cpp reads at about 4.5-5 bits a weight. The
int8 layers (int8_weights.py) read 8: on the 1.7B and 8B shapes Tandem's plain decoding wrote
0.67-0.75x llama-bench's on Q4_K_M files (docs/BENCHMARKS.md). These layers read 5 bits a
weight, Q4_1's scheme: 16 levels per group of 32 weights from the group's smallest weight to its
largest, a bf16 scale and a bf16 minimum per group. (Q4_0's symmetric levels, 4.5 bits, kept
the demo target's next token 70% of the time: its weights come from a Q4_1 file, which
minimums and scales per 32 reproduce almost exactly, 98.7%; docs/BENCHMARKS.md. A Q4_K file's
weights are a scale and a minimum per 32 as well.)

The product (`int4_matmul.c`; `reference_product` here, the same arithmetic in torch) rounds each
activation row to int8 per group of 32 as llama.cpp does for its 4-bit files, sums each group in
integers and adds the groups up in float32 in order. A row's output never depends on the rows batched with
it, so a verify gives each token the logits a one-token step gives it, as with int8.

The embedding table and the output head stay int8 (Q4_K_M keeps its output head at 6 bits too):
the head decides every token, and it is a small part of a 1-8B model's bytes.

The packed layout the C code reads, weight rows in blocks of 16 (the last padded with zeros):
block b, group g is 256 bytes, 4 vectors of 64; in vector v, bytes 4r..4r+3 belong to row
16b + r: byte i's low nibble is input 32g + 8v + i, its high nibble input 32g + 8v + 4 + i. The
scales: block b, group g, the 16 rows' scales then their 16 minimums, as bf16 bits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import int8_kernel  # the library loader (the int4 product is built into the same library)
from .cpu import forward_threads

GROUP = 32  # inputs per scale
BLOCK_ROWS = 16  # rows packed together


def quantise_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(levels uint8 in [0, 15] (n, k), bf16 scales and bf16 minimums (n, k / 32)) with
    weight ≈ levels * scale + minimum per group: the group's smallest weight at level 0, its
    largest at 15. Scale and minimum are rounded to bf16 first, and the levels are rounded
    against the rounded ones."""
    rows, width = weight.shape
    if width % GROUP:
        raise ValueError(f"int4 weights need inputs in whole groups of {GROUP}, not {width}")
    groups = weight.detach().float().reshape(rows, width // GROUP, GROUP)
    smallest, largest = groups.amin(dim=2, keepdim=True), groups.amax(dim=2, keepdim=True)
    scale = ((largest - smallest) / 15.0).to(torch.bfloat16)
    minimum = smallest.to(torch.bfloat16)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    levels = torch.round((groups - minimum.float()) / divisor).clamp(0, 15).to(torch.uint8)
    return levels.reshape(rows, width), scale.reshape(rows, -1), minimum.reshape(rows, -1)


def pack(levels: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout (module docstring) of `quantise_groups`' levels, scales and minimums:
    (uint8 (blocks, G, 4, 16, 4), int16 bf16 bits (blocks, G, 2, 16): scales, then minimums)."""
    rows, width = levels.shape
    blocks, groups = -(-rows // BLOCK_ROWS), width // GROUP
    padded = torch.zeros(blocks * BLOCK_ROWS, width, dtype=torch.uint8)
    padded[:rows] = levels
    # (block, row, group, vector, half, i) -> (block, group, vector, row, i) for each half
    nibbles = padded.reshape(blocks, BLOCK_ROWS, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
    packed = (nibbles[..., 0, :] | (nibbles[..., 1, :] << 4)).contiguous()
    pairs = torch.zeros(blocks * BLOCK_ROWS, groups, 2, dtype=torch.bfloat16)
    pairs[:rows, :, 0], pairs[:rows, :, 1] = scales, minimums
    packed_scales = pairs.reshape(blocks, BLOCK_ROWS, groups, 2).permute(0, 2, 3, 1).contiguous().view(torch.int16)
    return packed, packed_scales


def unpack(packed: torch.Tensor, packed_scales: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`pack`'s inverse: (levels (rows, k) uint8, scales and minimums (rows, k / 32) bf16)."""
    blocks, groups = packed.shape[:2]
    halves = torch.stack([packed & 0x0F, packed >> 4], dim=-2)  # (block, group, vector, row, half, i)
    levels = halves.permute(0, 3, 1, 2, 4, 5).reshape(blocks * BLOCK_ROWS, groups * GROUP)[:rows]
    pairs = packed_scales.view(torch.bfloat16).permute(0, 3, 1, 2).reshape(blocks * BLOCK_ROWS, groups, 2)[:rows]
    return levels, pairs[..., 0], pairs[..., 1]


def dequantised(levels: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The weight the levels stand for, float32 (n, k)."""
    rows = levels.shape[0]
    groups = levels.float().reshape(rows, -1, GROUP) * scales.float()[..., None] + minimums.float()[..., None]
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


def reference_product(x: torch.Tensor, levels: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """x (m, k) times the int4 weight (`unpack`'s levels, scales and minimums) transposed, in
    float32: what int4_matmul.c computes, to the bit. Each group's integer sum is exact in
    float64 (at most 32 x 15 x 127); per group, its sum times (weight scale x activation scale),
    plus the weight's minimum times (activation scale x the levels' sum), added to the total in
    group order, as the C code does."""
    activations, activation_scales, level_sums = round_groups(x.float())
    rows, width = levels.shape
    weight_groups = levels.double().reshape(rows, width // GROUP, GROUP)
    sums = torch.einsum("mgi,ngi->mgn", activations.double(), weight_groups).float()  # (m, G, n), exact
    weight_scales, weight_minimums = scales.float(), minimums.float()  # (n, G)
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
        return reference_product(x, *layer.unpacked())
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
        packed, scales = pack(*quantise_groups(linear.weight))
        return cls(packed, scales, linear.weight.shape[0], linear.bias)

    @property
    def out_features(self) -> int:
        return self.rows

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * GROUP

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(levels, scales, minimums) as `quantise_groups` gives them."""
        return unpack(self.packed, self.scales, self.rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if x.device.type == "cpu":
            out = int4_product(flat.float(), self)
        else:  # another device: the weight as floats, then a float matmul
            out = F.linear(flat.float(), dequantised(*self.unpacked()).to(flat.device))
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
        packed, scales = pack(*(torch.cat(tensors) for tensors in zip(*unpacked)))
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
