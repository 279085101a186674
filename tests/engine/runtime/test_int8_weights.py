"""Weight-only int8 on the CPU: the fused int8 kernel gives the product the bf16 copy of the
weight gave, with and without a bias, for any leading shape."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import int8_weights
from engine.runtime.int8_weights import Int8Linear


def unfused(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    out = F.linear(x, layer.weight.to(x.dtype)) * layer.scale
    if layer.bias is not None:
        out = out + layer.bias
    return out.to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 7, 64), (5, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_kernel_gives_the_product_of_the_int8_rows(shape, bias, monkeypatch):
    torch.manual_seed(3)
    linear = torch.nn.Linear(64, 96, bias=bias).to(torch.bfloat16)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(shape, dtype=torch.bfloat16)
    calls = []
    fused_kernel = torch._weight_int8pack_mm
    monkeypatch.setattr(int8_weights.torch, "_weight_int8pack_mm", lambda *args: calls.append(1) or fused_kernel(*args))

    out = layer(x)

    assert calls  # the CPU path took the fused kernel, not a bf16 copy of the weight
    reference = unfused(layer, x)
    assert out.shape == reference.shape == (*shape[:-1], 96) and out.dtype == torch.bfloat16
    assert (out.float() - reference.float()).abs().max() <= 0.01 * reference.float().abs().max()  # bf16 rounding


def test_float32_activations_keep_the_plain_matmul(monkeypatch):
    layer = Int8Linear.from_linear(torch.nn.Linear(64, 32))
    monkeypatch.setattr(int8_weights.torch, "_weight_int8pack_mm", lambda *args: pytest.fail("fused kernel on fp32"))
    x = torch.randn(3, 64)
    assert torch.equal(layer(x), unfused(layer, x))
