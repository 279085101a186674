"""The decoder's RMS norm as one Triton kernel on a CUDA GPU, for the static runtime.

Why: transformers' RMSNorm is seven small kernels (to float32, square, mean, add, rsqrt,
multiply, cast and scale), and a one-token forward of a small model is launch-bound: on an
H100 the demo target's captured step took 3.4 ms for weights the GPU reads in 0.1 ms. One
kernel per norm took 28% off that step (docs/BENCHMARKS.md).

It computes what Llama's RMSNorm computes, in the same order of roundings: the row in
float32, scaled by rsqrt(mean of squares + eps), rounded to the input's dtype, then times the
weight in that dtype. Only the norms known to compute exactly that are replaced
(`fused_norm`); any other (Gemma's 1 + weight, a norm with a bias) runs as it is.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .int8_cuda import kernels

# transformers' RMS norms whose forward is LlamaRMSNorm's formula.
LLAMA_STYLE_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm"})


def fused_norm(norm: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """`norm` as one kernel where it is a Llama-style RMS norm on a GPU the kernel runs on,
    else `norm` itself."""
    if type(norm).__name__ not in LLAMA_STYLE_NORMS or not hasattr(norm, "variance_epsilon"):
        return norm
    if failure(norm.weight.device) is not None:
        return norm
    weight, epsilon = norm.weight, float(norm.variance_epsilon)
    return lambda x: rms_norm(x, weight, epsilon)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """x (..., D) in its dtype; weight (D,)."""
    module = kernels()
    if isinstance(module, str):
        raise RuntimeError(module)
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, width = flat.shape
    out = torch.empty((rows, width), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    block = 1 << (width - 1).bit_length()  # the whole row in one block
    module.rms_norm[(rows,)](flat, weight, out, width, flat.stride(0), epsilon, BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return out.reshape(*x.shape[:-1], width)


@functools.cache
def failure(device: torch.device) -> str | None:
    """None where the kernel compiles and matches the formula on `device`, else why not
    (checked once per device, when a runtime is built, before any graph capture)."""
    module = kernels()
    if isinstance(module, str):
        return module
    for width in (40, 2048):
        try:
            x = torch.linspace(-2, 3, 2 * width, device=device).reshape(2, width).to(torch.float16)
            weight = torch.linspace(0.5, 1.5, width, device=device).to(torch.float16)
            got = rms_norm(x, weight, 1e-5)
        except Exception as error:  # noqa: BLE001 -- any failure keeps transformers' norm
            return f"the Triton RMS norm failed on {device}: {error}"
        values = x.float()
        expected = weight * (values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)
        if not torch.allclose(got.float(), expected.float(), rtol=2e-3, atol=2e-3):
            return f"the Triton RMS norm gave wrong values on {device}"
    return None
