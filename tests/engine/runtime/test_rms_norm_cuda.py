"""The Triton RMS norm (rms_norm_cuda.py) against transformers' own, on a GPU or in Triton's
interpreter where Triton is installed (CI's CPU-only torch has none: skipped there)."""
from __future__ import annotations

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from engine.runtime import rms_norm_cuda

pytest.importorskip("triton")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")  # conftest.py: the interpreter without a GPU


@pytest.mark.parametrize("width", [40, 576, 2048])
def test_the_fused_norm_gives_llamas_norm(device, width):
    torch.manual_seed(width)
    # the interpreter has no bfloat16
    for dtype in [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else []):
        norm = LlamaRMSNorm(width, eps=1e-6).to(device, dtype)
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.5)
        x = (torch.randn(3, 5, width) * 4).to(device, dtype)
        fused = rms_norm_cuda.fused_norm(norm)
        assert fused is not norm
        got, expected = fused(x), norm(x)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        # the same roundings in the same order; rsqrt may differ in its last float32 bit
        torch.testing.assert_close(got, expected, rtol=1e-2 if dtype != torch.float32 else 1e-6, atol=1e-5)


def test_a_norm_of_another_formula_is_kept(device):
    norm = Gemma2RMSNorm(64).to(device)  # (1 + weight), all in float32
    assert rms_norm_cuda.fused_norm(norm) is norm


def test_the_kernel_passes_its_own_check(device):
    assert rms_norm_cuda.failure(device) is None
