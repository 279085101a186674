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
- Where Triton is missing or cannot compile (an old GPU, a torch without it), the layer
  keeps the unfused product; `failure(device)` says why and the test suite checks the
  kernel against it, on a GPU or in Triton's interpreter (`TRITON_INTERPRET=1`) where
  Triton is installed.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError as error:  # the CPU-only torch wheels do not bring Triton
    triton = None
    _IMPORT_ERROR = f"Triton is not installed ({error})"
else:
    _IMPORT_ERROR = None


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) float; weight (N, K) int8 with row stride possibly wider than K; scale (N,)
    float32; bias (N,) or None. Returns (..., N) in x's dtype: (x @ weight.T) * scale + bias."""
    if weight.stride(1) != 1:
        raise ValueError("the int8 weight's rows must be contiguous")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    rows, depth = flat.shape
    outputs = weight.shape[0]
    out = torch.empty((rows, outputs), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps, stages = _blocks(rows, outputs)
    grid = (-(-outputs // block_n), -(-rows // block_m))  # ceil divisions
    _int8_linear_kernel[grid](
        flat, weight, scale, bias if bias is not None else scale, out,
        rows, outputs, depth, flat.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )
    return out.reshape(*x.shape[:-1], outputs)


def _blocks(rows: int, outputs: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). A few tokens make the product a stream over
    the weight: narrow column blocks give every multiprocessor (132 on an H100) blocks of its
    own to read, deep K blocks keep several loads in flight. Prompts take wider blocks."""
    if rows <= 16:
        return 16, (32 if outputs <= 16384 else 64), 256, 4, 4
    if rows <= 64:
        return 64, 64, 128, 4, 4
    return 128, 128, 64, 8, 3


if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _int8_linear_kernel(
        x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        depth = tl.arange(0, BLOCK_K)
        sums = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + depth
            x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            w = tl.load(w_ptr + columns[:, None] * stride_wn + ks[None, :], mask=(columns[:, None] < N) & (ks[None, :] < K), other=0)
            # int8 values are exact in bf16 and fp16 (8 and 11 significant bits).
            sums += tl.dot(x, tl.trans(w.to(x.dtype)))
        scale = tl.load(scale_ptr + columns, mask=columns < N, other=0.0)
        out = sums * scale[None, :]
        if HAS_BIAS:
            out += tl.load(bias_ptr + columns, mask=columns < N, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + rows[:, None] * stride_om + columns[None, :], out.to(out_ptr.dtype.element_ty),
            mask=(rows[:, None] < M) & (columns[None, :] < N),
        )


@functools.cache
def failure(device: torch.device) -> str | None:
    """None where the kernel compiles and gives the right sums on this GPU, else why not
    (checked once per device, on the first int8 layer's first call, before any graph capture)."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    try:
        x = torch.ones(2, 40, dtype=torch.float16, device=device)
        weight = torch.full((24, 40), -3, dtype=torch.int8, device=device)
        got = linear(x, weight, torch.full((24,), 0.5, device=device), torch.ones(24, dtype=torch.float16, device=device))
    except Exception as error:  # noqa: BLE001 -- any failure keeps the unfused product
        return f"the Triton int8 kernel failed on {device}: {error}"
    if not bool((got == -59).all()):
        return f"the Triton int8 kernel gave wrong sums on {device}"
    return None
