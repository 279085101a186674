"""Int8 layers on the CPU: an integer matmul whose product is the float product of the int8
rows up to the activations' second rounding, and whose rows never depend on the batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import int8_weights
from engine.runtime.int8_kernel import weight_row_sums
from engine.runtime.int8_weights import Int8Linear, integer_product, join_rows, quantise_weight_only
from engine.runtime.joined_projections import JoinedProjections
from engine.runtime.torch_static import StaticTorchRuntime

from ..tiny_models import tiny_llama
from .test_static_families import tiny


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
    error = (integer_product(x, weight, weight_row_sums(weight)) - reference).abs().max() / reference.abs().max()

    one_scale = x.abs().amax(dim=1, keepdim=True) / 127.0
    one_level = (torch.round(x / one_scale) * one_scale) @ weight.float().T
    one_level_error = (one_level - reference).abs().max() / reference.abs().max()
    assert error < 1e-3 and error < one_level_error / 50  # the second level is what brings it down


def test_a_rows_product_is_the_same_alone_or_in_any_batch():
    weight = torch.randint(-127, 128, (64, 320), dtype=torch.int8)
    batch = with_outlier_channels(9, 320, seed=4)
    together = integer_product(batch, weight, weight_row_sums(weight))
    for row in range(batch.shape[0]):
        assert torch.equal(integer_product(batch[row : row + 1], weight, weight_row_sums(weight)), together[row : row + 1])
    assert torch.equal(integer_product(batch[2:6], weight, weight_row_sums(weight)), together[2:6])


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 7, 64), (5, 64)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_takes_the_integer_matmul_for_any_leading_shape(shape, bias, dtype, monkeypatch):
    torch.manual_seed(3)
    layer = Int8Linear.from_linear(torch.nn.Linear(64, 96, bias=bias).to(dtype))
    x = torch.randn(shape, dtype=dtype)
    calls = []
    integer_product = int8_weights.integer_product
    monkeypatch.setattr(int8_weights, "integer_product", lambda *args: calls.append(1) or integer_product(*args))

    out = layer(x)

    assert calls == [1]  # both roundings in one matmul
    reference = float_product(layer, x)
    assert out.shape == reference.shape == (*shape[:-1], 96) and out.dtype == dtype
    rounding = 1e-4 if dtype == torch.float32 else 1e-2  # the output's own dtype's rounding
    assert (out.float() - reference).abs().max() <= rounding * reference.abs().max()


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("seed", range(3))
def test_a_verify_gives_each_token_the_logits_a_one_token_step_gives_it(seed, native):
    """Float matmuls sum a k-row batch in another order than one row (fp32 logits differ in
    the last bits here), so greedy speculation can part from plain decoding at a near-tie.
    The int8 model's matmuls are integer sums: a verify and the steps agree to the bit, in the
    native forward and in torch's."""
    model = quantise_weight_only(tiny_llama(seed=seed, vocab_size=64, hidden=64))
    ids = [5, 9, 11, 40, 2, 7, 33, 12, 3, 8]
    verifying = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False, native=native)
    verified = verifying.forward(ids, logits_wanted=8)
    stepping = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False, native=native)
    stepping.forward(ids[:2], logits_wanted=1)
    stepped = torch.cat([stepping.forward([token], logits_wanted=1) for token in ids[2:]])
    assert torch.equal(verified, stepped)


def test_joined_layers_give_the_parts_outputs_to_the_bit_and_hold_no_second_copy():
    torch.manual_seed(5)
    parts = [Int8Linear.from_linear(torch.nn.Linear(64, out, bias=True)) for out in (64, 32, 32)]
    x = with_outlier_channels(3, 64, seed=5)
    before = [part(x) for part in parts]

    joined = join_rows(parts)

    assert torch.equal(joined(x), torch.cat(before, dim=-1))
    assert all(torch.equal(part(x), alone) for part, alone in zip(parts, before))  # the parts still run on their own
    rows = 0
    for part in parts:  # ...reading their rows of the joined weight
        assert part.weight.data_ptr() == joined.weight[rows].data_ptr() and part.scale.data_ptr() == joined.scale[rows].data_ptr()
        rows += part.out_features
    again = join_rows(parts)  # a second runtime over the same model shares the joined weight
    assert again.weight.data_ptr() == joined.weight.data_ptr() and torch.equal(again(x), joined(x))
    with pytest.raises(ValueError, match="bias"):
        join_rows([Int8Linear.from_linear(torch.nn.Linear(8, 8)), Int8Linear.from_linear(torch.nn.Linear(8, 8, bias=False))])


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma2", "phi3"])
def test_the_static_forward_joins_the_int8_projections_and_keeps_every_logit(family):
    """q/k/v and gate/up run as one integer matmul each (Phi-3 joins q/k/v itself, and its
    gate_up_proj): 4 matmuls a layer instead of 7, and the same logits to the bit."""
    model = quantise_weight_only(tiny(family))
    ids = [5, 9, 11, 40, 2, 7, 33, 12]
    separate = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False)
    layers = len(model.model.layers)
    separate.forward_pass.joined = [JoinedProjections()] * layers  # every projection on its own
    joined = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False)
    calls = []
    integer_product = int8_weights.integer_product
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(int8_weights, "integer_product", lambda *args: calls.append(1) or integer_product(*args))
        logits = joined.forward(ids, logits_wanted=4)
    assert torch.equal(logits, separate.forward(ids, logits_wanted=4))
    # qkv, o, gate_up, down (Phi-3's own qkv_proj and gate_up_proj likewise), and the LM head
    assert len(calls) == 4 * layers + 1


def test_a_verify_across_a_key_window_and_a_trees_branch_give_the_steps_logits_to_the_bit():
    """The torch forward on the CPU (exact_attention.py): each token attends alone over the
    rows it sees, so neither the batch, the key window's width (steps at 255 slots read a
    256-row window, the verify past it a 512-row one) nor a tree's other branches change its
    bits. Before, a batched attention call gave the verify other last bits on AMD CPUs."""
    model = quantise_weight_only(tiny_llama(seed=4, vocab_size=64, hidden=64))
    generator = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 64, (186,), generator=generator).tolist()  # slots 0..185 sit in rows 64..249
    branch = [7, 30, 2, 51, 9, 12, 44, 3]  # slots 186..193: rows 250..257, across the 256-row window

    def runtime():
        opened = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, native=False)
        opened.forward(prompt, logits_wanted=1)
        return opened

    stepping = runtime()
    stepped = torch.cat([stepping.forward([token], logits_wanted=1) for token in branch])
    verified = runtime().forward(branch, logits_wanted=len(branch))
    assert torch.equal(verified, stepped)

    # A tree: a side branch of three tokens first, then the main branch; each main-branch token
    # sees its ancestors in rows that are not one run, and must still get the step's logits.
    side = [60, 61, 62]
    tree_ids = side + branch
    start = len(prompt)
    parents = [start - 1, start, start + 1] + [start - 1] + list(range(start + 3, start + 3 + len(branch) - 1))
    tree_logits = runtime().forward_tree(tree_ids, parents, logits_wanted=len(tree_ids))
    assert torch.equal(tree_logits[len(side):], stepped)
