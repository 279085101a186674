"""Tandem's Triton kernels for CUDA GPUs. Imported only where a GPU path needs one
(`int8_cuda.kernels()`, which says why not where Triton cannot be imported), so a CPU-only
run never imports Triton.

- `int8_linear`: (x @ W.T) * scale + bias for an int8 weight W, in one pass (int8_cuda.py).
- `rms_norm`: Llama's RMS norm of each row (rms_norm_cuda.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def int8_linear(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    sums = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + depth
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + columns[:, None] * stride_wn + ks[None, :], mask=(columns[:, None] < N) & (ks[None, :] < K), other=0)
        # int8 values are exact in bf16 and fp16 (8 and 11 significant bits). float32
        # activations are multiplied in float32 (IEEE), as torch's matmul does by default,
        # not in TF32.
        if IEEE:
            sums += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
        else:
            sums += tl.dot(x, tl.trans(w.to(x.dtype)))
    scale = tl.load(scale_ptr + columns, mask=columns < N, other=0.0)
    out = sums * scale[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + columns, mask=columns < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_om + columns[None, :], out.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (columns[None, :] < N),
    )


@triton.jit
def rms_norm(x_ptr, w_ptr, out_ptr, D, stride_x, epsilon, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < D
    x = tl.load(x_ptr + row * stride_x + columns, mask=inside, other=0.0)
    values = x.to(tl.float32)
    mean_square = tl.sum(values * values, axis=0) / D
    normed = (values * tl.rsqrt(mean_square + epsilon)).to(x.dtype)  # rounded to x's dtype, as transformers does
    w = tl.load(w_ptr + columns, mask=inside, other=0.0)
    out = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * D + columns, out.to(out_ptr.dtype.element_ty), mask=inside)
