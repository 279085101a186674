"""The CUDA int8 kernel (int8_cuda.py) against the product it fuses. On a GPU it runs there;
elsewhere in Triton's interpreter, where Triton is installed (the CPU-only torch wheels do
not bring it, so CI skips these; the interpreter has no bfloat16, so there it checks
float16 and float32)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import int8_cuda
from engine.runtime.int8_weights import Int8Linear, join_rows

pytest.importorskip("triton")


@pytest.fixture
def device() -> torch.device:
    """Where the kernel runs: the GPU, or the CPU under Triton's interpreter (conftest.py
    sets TRITON_INTERPRET before Triton is imported where there is no GPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtypes(device: torch.device) -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16] if device.type == "cuda" else [torch.float16, torch.float32]


# Every block shape (int8_cuda._blocks): 1-16 rows, narrow and vocabulary-wide; 17-64; more.
@pytest.mark.parametrize(
    ("rows", "outputs", "depth", "with_bias"),
    [(1, 24, 40, True), (5, 96, 300, False), (3, 16500, 64, False), (17, 200, 64, True), (70, 130, 520, False), (130, 64, 32, True)],
)
def test_the_kernel_gives_the_scaled_and_biased_product(device, rows, outputs, depth, with_bias):
    generator = torch.Generator().manual_seed(rows * outputs + depth)
    for dtype in _dtypes(device):
        x = torch.randn(rows, depth, generator=generator).to(device, dtype)
        weight = torch.randint(-127, 128, (outputs, depth), generator=generator, dtype=torch.int8).to(device)
        scale = (torch.rand(outputs, generator=generator) * 0.01).to(device)
        bias = torch.randn(outputs, generator=generator).to(device, dtype) if with_bias else None
        got = int8_cuda.linear(x, weight, scale, bias)
        expected = (x.double() @ weight.double().T) * scale.double() + (bias.double() if with_bias else 0)
        assert got.dtype == dtype and got.shape == (rows, outputs)
        # Summed in float32 and rounded once: within the output dtype's half-unit of the exact value.
        tolerance = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
        assert torch.allclose(got.double(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


def test_joined_rows_read_their_own_rows_of_the_shared_weight(device):
    """q, k and v share one weight (join_rows): each part is a view starting mid-tensor."""
    torch.manual_seed(0)
    # on the device before joining: `.to()` after would copy each view apart
    parts = [Int8Linear.from_linear(torch.nn.Linear(48, width)).to(device) for width in (32, 16, 16)]
    joined = join_rows(parts)
    assert all(part.weight._base is joined.weight for part in parts)
    x = torch.randn(3, 48).to(device, torch.float16)
    whole = int8_cuda.linear(x, joined.weight, joined.scale, joined.bias.to(torch.float16))
    start = 0
    for part in parts:
        got = int8_cuda.linear(x, part.weight, part.scale, part.bias.to(torch.float16))
        assert torch.equal(got, whole[:, start:start + part.out_features])
        start += part.out_features


def test_the_kernel_passes_its_own_check(device):
    for dtype in _dtypes(device):
        assert int8_cuda.failure(device, dtype) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the layer takes the kernel on CUDA tensors only")
def test_a_kernel_that_fails_is_given_up_and_the_layer_still_gives_its_product(monkeypatch):
    """A launch that fails after the check passed warns once and leaves the layer on the
    unfused product."""
    layer = Int8Linear.from_linear(torch.nn.Linear(32, 8))
    x = torch.randn(2, 32)
    expected = layer(x)  # the CPU's integer product
    layer, x = layer.to("cuda"), x.to("cuda", torch.bfloat16)

    def out_of_resources(*args):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(int8_cuda, "_FAILURES", {(x.device, x.dtype): None})
    monkeypatch.setattr(int8_cuda, "linear", out_of_resources)
    with pytest.warns(RuntimeWarning, match="out of resources"):
        got = layer(x)
    assert int8_cuda.failure(x.device, x.dtype) is not None
    torch.testing.assert_close(got.float().cpu(), expected, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the layer takes the kernel on CUDA tensors only")
def test_an_int8_layer_on_a_gpu_gives_the_unfused_product():
    torch.manual_seed(1)
    layer = Int8Linear.from_linear(torch.nn.Linear(576, 1536)).to("cuda")
    x = torch.randn(4, 7, 576, device="cuda", dtype=torch.bfloat16)
    assert int8_cuda.failure(x.device, x.dtype) is None  # else the layer below would not take the kernel
    unfused = ((F.linear(x, layer.weight.to(x.dtype)).float() * layer.scale) + layer.bias).to(x.dtype)
    fused = layer(x)
    assert fused.shape == unfused.shape and fused.dtype == torch.bfloat16
    # The unfused path rounds the product to bf16 before scaling: at most a unit apart.
    assert torch.allclose(fused.float(), unfused.float(), rtol=2e-2, atol=2e-2 * unfused.abs().max().item())
