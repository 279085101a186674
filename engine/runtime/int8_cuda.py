"""The int8 layers' product on a CUDA GPU: one Triton kernel that reads the int8 weight,
turns it into the activations' dtype in registers, multiplies, and applies the row scale and
the bias before it writes the output.

Why: without it an int8 layer on a GPU was four kernels (the weight copied to bf16, the bf16
matmul, the scale, the cast back), so the int8 target ran at 0.72x of bf16 on an H100
(docs/BENCHMARKS.md) while holding half the weights. One kernel reads half of bf16's bytes
and launches as often as bf16's matmul: at one token, where a forward reads every weight
once, that is the whole cost.

- The products are summed in float32 on the tensor cores (`tl.dot`), and scaled in float32
  before the one rounding to the activations' dtype (the unfused path rounded the bf16
  product first, then scaled it).
- Triton compiles a kernel per block shape and dtype on its first call, which the runtime
  makes while it warms up, before it captures its CUDA graphs; a launch is then capturable
  like any other kernel.
- Where Triton is missing or the kernel cannot compile or gives wrong sums (an old GPU, a
  torch without Triton), the layer keeps the unfused product; `failure(device, dtype)` says
  why. It checks every block shape the layers use, once per device and dtype, on the first
  int8 layer's first call (before any graph capture); a launch that still fails later gives
  the kernel up for that device and dtype (`give_up`). The tests check the kernel against
  float64 sums on a GPU, or in Triton's interpreter (`TRITON_INTERPRET=1`) where Triton is
  installed.
"""
from __future__ import annotations

import functools
import warnings
from types import ModuleType

import torch

# Why the kernel does not run, by (device, dtype); a missing key: not checked yet.
_FAILURES: dict[tuple[torch.device, torch.dtype], str | None] = {}


@functools.cache
def kernels() -> ModuleType | str:
    """The Triton kernels' module, or why it cannot be imported (the CPU-only torch wheels
    bring no Triton). Imported on first use only."""
    try:
        from . import triton_kernels
    except Exception as error:  # noqa: BLE001 -- a missing or broken Triton keeps the unfused paths
        return f"Triton could not be imported ({type(error).__name__}: {error})"
    return triton_kernels


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) float; weight (N, K) int8 with row stride possibly wider than K; scale (N,)
    float32; bias (N,) or None. Returns (..., N) in x's dtype: (x @ weight.T) * scale + bias."""
    module = kernels()
    if isinstance(module, str):
        raise RuntimeError(module)
    if weight.stride(1) != 1 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"an int8 weight of shape {tuple(weight.shape)} (contiguous rows) cannot multiply {x.shape[-1]}-wide rows")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    rows, depth = flat.shape
    outputs = weight.shape[0]
    out = torch.empty((rows, outputs), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps, stages = _blocks(rows, outputs)
    grid = (-(-outputs // block_n), -(-rows // block_m))  # ceil divisions
    module.int8_linear[grid](
        flat, weight, scale, bias if bias is not None else scale, out,
        rows, outputs, depth, flat.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )
    return out.reshape(*x.shape[:-1], outputs)


def _blocks(rows: int, outputs: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). A few tokens make the product a stream over
    the weight: narrow column blocks give every multiprocessor (132 on an H100) blocks of its
    own to read, deep K blocks keep several loads in flight. Verifies of 17-64 tokens keep
    16-row blocks and read the weight once per 16 rows (from L2): 64x64 blocks left the
    demo's 1536-wide layers 24 blocks for 132 multiprocessors, and at 32 rows ran 0.85x
    (1.7B) / 0.94x (8B) of bf16's whole forward against 1.01x / 1.10x with these (seven
    shapes measured on an H100: docs/bench/int8_cuda_blocks.py, docs/BENCHMARKS.md).
    Prompts take wider blocks."""
    if rows <= 16:
        return 16, (32 if outputs <= WIDE_OUTPUTS else 64), 256, 4, 4
    if rows <= 64:
        return 16, 32, 256, 4, 4
    return 128, 128, 64, 8, 3


WIDE_OUTPUTS = 16384  # past this many outputs (a vocabulary), one-token blocks are twice as wide
# (rows, outputs, bias) the check runs: each block shape of `_blocks`, with and without a bias.
CHECKED_SHAPES = ((2, 24, True), (20, 24, False), (80, 24, True), (2, WIDE_OUTPUTS + 16, False))


def failure(device: torch.device, dtype: torch.dtype) -> str | None:
    """None where the kernel compiles and gives the right sums for `dtype` activations on
    this GPU in every block shape, else why not. Checked once per device and dtype; a
    shortage of memory is not kept, so a later call checks again."""
    key = (device, dtype)
    if key not in _FAILURES:
        reason = _check(device, dtype)
        if reason is not None and "out of memory" in reason.lower():
            return reason
        _FAILURES[key] = reason
    return _FAILURES[key]


def give_up(device: torch.device, dtype: torch.dtype, error: Exception) -> None:
    """A launch failed after the check passed: the unfused product from now on, said once."""
    _FAILURES[(device, dtype)] = f"the Triton int8 kernel failed on {device}: {error}"
    warnings.warn(f"{_FAILURES[(device, dtype)]}; int8 layers use the unfused product (slower)", RuntimeWarning, stacklevel=3)


def _check(device: torch.device, dtype: torch.dtype) -> str | None:
    module = kernels()
    if isinstance(module, str):
        return module
    depth = 40
    generator = torch.Generator().manual_seed(0)
    for rows, outputs, with_bias in CHECKED_SHAPES:
        x = torch.randn(rows, depth, generator=generator).to(device, dtype)
        weight = torch.randint(-127, 128, (outputs, depth), generator=generator, dtype=torch.int8).to(device)
        scale = (torch.rand(outputs, generator=generator) / 64).to(device)
        bias = torch.randn(outputs, generator=generator).to(device, dtype) if with_bias else None
        try:
            got = linear(x, weight, scale, bias)
        except Exception as error:  # noqa: BLE001 -- any failure keeps the unfused product
            return f"the Triton int8 kernel failed on {device} ({rows} rows, {outputs} outputs): {error}"
        expected = (x.double() @ weight.double().T) * scale.double() + (bias.double() if bias is not None else 0)
        # within a few units of the output dtype's rounding of the largest value
        tolerance = 8 * torch.finfo(dtype).eps * float(expected.abs().max())
        if not bool(((got.double() - expected).abs() <= tolerance).all()):
            return f"the Triton int8 kernel gave wrong sums on {device} ({rows} rows, {outputs} outputs, {dtype})"
    return None
