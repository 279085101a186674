"""Int8 layers on the CPU: an integer matmul whose product is the float product of the int8
rows up to the activations' second rounding, and whose rows never depend on the batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import int8_weights
from engine.runtime.int8_weights import Int8Linear, integer_product, quantise_weight_only
from engine.runtime.torch_static import StaticTorchRuntime

from ..tiny_models import tiny_llama


def float_product(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """What the layer computes with its int8 rows and float32 activations."""
    out = F.linear(x.float(), layer.weight.float()) * layer.scale
    if layer.bias is not None:
        out = out + layer.bias.float()
    return out


def with_outlier_channels(rows: int, width: int, seed: int) -> torch.Tensor:
    """Activations as LLMs make them: a few channels tens of times larger than the rest."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    x[:, [3, 17]] *= 60.0
    return x


def test_two_roundings_of_the_activations_keep_the_float_product_where_one_does_not():
    torch.manual_seed(1)
    weight = torch.randint(-127, 128, (96, 256), dtype=torch.int8)
    x = with_outlier_channels(8, 256, seed=2)
    reference = x @ weight.float().T
    error = (integer_product(x, weight) - reference).abs().max() / reference.abs().max()

    one_scale = x.abs().amax(dim=1, keepdim=True) / 127.0
    one_level = (torch.round(x / one_scale) * one_scale) @ weight.float().T
    one_level_error = (one_level - reference).abs().max() / reference.abs().max()
    assert error < 1e-3 and error < one_level_error / 50  # the second level is what brings it down


def test_a_rows_product_is_the_same_alone_or_in_any_batch():
    weight = torch.randint(-127, 128, (64, 320), dtype=torch.int8)
    batch = with_outlier_channels(9, 320, seed=4)
    together = integer_product(batch, weight)
    for row in range(batch.shape[0]):
        assert torch.equal(integer_product(batch[row : row + 1], weight), together[row : row + 1])
    assert torch.equal(integer_product(batch[2:6], weight), together[2:6])


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 7, 64), (5, 64)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_takes_the_integer_matmul_for_any_leading_shape(shape, bias, dtype, monkeypatch):
    torch.manual_seed(3)
    layer = Int8Linear.from_linear(torch.nn.Linear(64, 96, bias=bias).to(dtype))
    x = torch.randn(shape, dtype=dtype)
    calls = []
    integer_matmul = torch._int_mm
    monkeypatch.setattr(int8_weights.torch, "_int_mm", lambda *args: calls.append(1) or integer_matmul(*args))

    out = layer(x)

    assert calls == [1]  # both roundings in one matmul
    reference = float_product(layer, x)
    assert out.shape == reference.shape == (*shape[:-1], 96) and out.dtype == dtype
    rounding = 1e-4 if dtype == torch.float32 else 1e-2  # the output's own dtype's rounding
    assert (out.float() - reference).abs().max() <= rounding * reference.abs().max()


@pytest.mark.parametrize("seed", range(3))
def test_a_verify_gives_each_token_the_logits_a_one_token_step_gives_it(seed):
    """Float matmuls sum a k-row batch in another order than one row (fp32 logits differ in
    the last bits here), so greedy speculation can part from plain decoding at a near-tie.
    The int8 model's matmuls are integer sums: a verify and the steps agree to the bit."""
    model = quantise_weight_only(tiny_llama(seed=seed, vocab_size=64, hidden=64))
    ids = [5, 9, 11, 40, 2, 7, 33, 12, 3, 8]
    verifying = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False)
    verified = verifying.forward(ids, logits_wanted=8)
    stepping = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False)
    stepping.forward(ids[:2], logits_wanted=1)
    stepped = torch.cat([stepping.forward([token], logits_wanted=1) for token in ids[2:]])
    assert torch.equal(verified, stepped)
