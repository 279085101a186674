"""The int4 layers (int4_weights.py): the rounding and the coded scales, the packed layout the C code reads, and
the kernel's floats, which are the torch reference's to the bit in every build this CPU runs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.runtime import int4_weights, int8_kernel
from engine.runtime.int4_weights import (
    GROUP, Int4Linear, dequantised, join_rows, pack, quantise_groups, reference_product, unpack,
)
from tests.engine.runtime.test_int8_kernel import CAN_BUILD, NO_KERNEL, activations, each_variant, fresh_kernel  # noqa: F401


def random_weight(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_each_group_runs_from_its_smallest_weight_at_level_0_to_its_largest_at_15():
    weight = random_weight(5, 96, seed=1)
    quantised = quantise_groups(weight)
    levels, scales, minimums = quantised.levels, quantised.scales(), quantised.minimums()
    assert levels.dtype == torch.uint8 and int(levels.max()) <= 15
    assert quantised.scale_codes.dtype == torch.uint8 and quantised.minimum_codes.dtype == torch.int8
    assert quantised.super_scales.dtype == quantised.super_minimums.dtype == torch.bfloat16
    assert scales.shape == minimums.shape == (5, 3) and quantised.super_scales.shape == (5, 1)
    assert int(quantised.scale_codes.max()) == 255 and int(quantised.minimum_codes.abs().max()) == 127  # a row's widest group
    groups = weight.reshape(5, 3, GROUP)
    assert (levels.reshape(5, 3, GROUP).gather(2, groups.argmax(dim=2, keepdim=True)) == 15).all()
    assert (levels.reshape(5, 3, GROUP).gather(2, groups.argmin(dim=2, keepdim=True)) == 0).all()
    # within half a level of the weight at the coded scale and minimum, but where the coding
    # put a weight past level 0 or 15 (clamped: within one level)
    error = (dequantised(quantised).reshape(5, 3, GROUP) - groups).abs()
    level = scales[..., None].expand_as(error)
    assert (error <= level * (1 + 1e-6)).all()
    assert (error <= level / 2 * (1 + 1e-6)).float().mean() > 0.95


def test_a_constant_group_has_level_zero_and_a_width_outside_whole_groups_is_refused():
    weight = random_weight(3, 64, seed=2)
    weight[1, :GROUP] = 0.25
    quantised = quantise_groups(weight)
    assert (quantised.levels[1, :GROUP] == 0).all() and float(quantised.scales()[1, 0]) == 0.0
    assert float(quantised.minimums()[1, 0]) == pytest.approx(0.25, rel=4e-3)  # 127 x its bf16 factor
    with pytest.raises(ValueError, match="whole groups of 32"):
        quantise_groups(random_weight(3, 48, seed=3))


@pytest.mark.parametrize("rows", [1, 16, 37])
def test_the_packed_layout_holds_each_row_and_input_where_the_kernel_reads_it(rows):
    quantised = quantise_groups(random_weight(rows, 320, seed=rows))  # 10 groups: a whole super-block and a short one
    packed, scale_bytes = pack(quantised)
    blocks = -(-rows // 16)
    assert packed.shape == (blocks, 10, 4, 16, 4) and packed.dtype == torch.uint8
    assert scale_bytes.shape == (blocks, 2 * 64 + 10 * 32) and scale_bytes.dtype == torch.uint8
    # spot checks against the module docstring: row 16b + r, input 32g + 8v + i (low), + 4 (high)
    for row, column in [(0, 0), (rows - 1, 319), (rows // 2, 37), (rows - 1, 4), (rows // 3, 290)]:
        b, r, g = row // 16, row % 16, column // GROUP
        v, within = (column % GROUP) // 8, column % 8
        byte = int(packed[b, g, v, r, within % 4])
        nibble = byte & 0x0F if within < 4 else byte >> 4
        assert nibble == int(quantised.levels[row, column])
        factors = (g // 8) * (64 + 8 * 32)  # each super-block's factors, then its groups' codes
        codes = factors + 64 + (g % 8) * 32
        assert int(scale_bytes[b, codes + r]) == int(quantised.scale_codes[row, g])
        assert int(scale_bytes[b, codes + 16 + r].view(torch.int8)) == int(quantised.minimum_codes[row, g])
        assert scale_bytes[b, factors + 2 * r : factors + 2 * r + 2].view(torch.bfloat16) == quantised.super_scales[row, g // 8]
        assert scale_bytes[b, factors + 32 + 2 * r : factors + 34 + 2 * r].view(torch.bfloat16) == quantised.super_minimums[row, g // 8]
    back = unpack(packed, scale_bytes, rows)
    assert all(torch.equal(got, given) for got, given in zip(back, quantised))


def test_the_product_is_near_the_float_product_of_the_rounded_weight():
    layer = nn.Linear(256, 40, bias=False)
    x = activations(3, 256, seed=4)
    quantised = quantise_groups(layer.weight)
    exact = x @ dequantised(quantised).T
    product = reference_product(x, quantised)
    # only the activations' rounding (8 bits per group) lies between them
    assert float((product - exact).abs().max()) < 0.02 * float(exact.abs().max())


def with_kernel(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    return int4_weights.int4_product(x, layer)


@pytest.mark.parametrize("count, width, rows", [(1, 64, 16), (1, 256, 40), (3, 96, 17), (8, 512, 64), (64, 128, 33), (9, 2048, 48)])
def test_the_kernel_gives_the_references_floats_in_every_build(each_variant, count, width, rows):  # noqa: F811
    layer = Int4Linear.from_linear(nn.Linear(width, rows, bias=False))
    x = activations(count, width, seed=count + width)
    assert torch.equal(with_kernel(x, layer), reference_product(x, layer.unpacked()))


def test_a_row_is_the_same_floats_alone_or_in_a_batch(each_variant):  # noqa: F811
    layer = Int4Linear.from_linear(nn.Linear(320, 50, bias=False))
    batch = activations(12, 320, seed=5)
    together = with_kernel(batch, layer)
    for row in range(12):
        assert torch.equal(with_kernel(batch[row:row + 1], layer)[0], together[row])


def test_rows_of_zeros_and_a_nan_come_out_as_the_reference_gives_them(each_variant):  # noqa: F811
    layer = Int4Linear.from_linear(nn.Linear(64, 20, bias=False))
    x = activations(3, 64, seed=6)
    x[0] = 0
    x[1, 40] = float("nan")
    got, expected = with_kernel(x, layer), reference_product(x, layer.unpacked())
    assert torch.equal(got[0], expected[0]) and bool((got[0] == 0).all())
    assert bool(got[1].isnan().all()) and bool(expected[1].isnan().all())
    assert torch.equal(got[2], expected[2])


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
def test_the_layer_adds_its_bias_and_keeps_the_input_dtype():
    linear = nn.Linear(64, 24)
    layer = Int4Linear.from_linear(linear)
    x = activations(2, 64, seed=7)
    expected = reference_product(x, layer.unpacked()) + linear.bias.detach()
    assert torch.equal(layer(x), expected)
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_without_the_kernel_the_layer_gives_the_same_floats(monkeypatch):
    layer = Int4Linear.from_linear(nn.Linear(128, 24, bias=False))
    x = activations(2, 128, seed=8)
    with_library = layer(x)
    monkeypatch.setattr(int8_kernel, "_tried", True)
    monkeypatch.setattr(int8_kernel, "_library", None)
    assert torch.equal(layer(x), with_library)


@pytest.mark.parametrize("sizes", [(32, 16, 16), (20, 12, 12)])
def test_joined_layers_give_their_parts_outputs_side_by_side(sizes):
    parts = [Int4Linear.from_linear(nn.Linear(96, size, bias=True)) for size in sizes]
    x = activations(3, 96, seed=9)
    apart = torch.cat([part(x) for part in parts], dim=1)
    joined = join_rows(parts)
    assert torch.equal(joined(x), apart)
    assert torch.equal(torch.cat([part(x) for part in parts], dim=1), apart)  # the parts still run alone
    if all(size % 16 == 0 for size in sizes):  # whole blocks: the parts are views of the joined weight
        assert parts[0].packed.data_ptr() == joined.packed.data_ptr()
        assert join_rows(parts).packed.data_ptr() == joined.packed.data_ptr()  # and a second join shares it


def test_four_and_five_eighths_bits_a_weight():
    layer = Int4Linear.from_linear(nn.Linear(4096, 4096, bias=False))
    bits = (layer.packed.numel() + layer.scales.numel()) * 8 / (4096 * 4096)
    assert bits == 4.625
    assert int4_weights.BLOCK_ROWS == 16


def test_a_model_at_four_bits_keeps_its_head_and_embedding_at_eight_and_odd_widths_too():
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.runtime.int8_weights import Int8Embedding, Int8Linear, quantise_weight_only

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=80, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True)
    model = quantise_weight_only(LlamaForCausalLM(config).eval(), bits=4)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, Int4Linear) and isinstance(layer.mlp.gate_proj, Int4Linear)
    assert isinstance(layer.mlp.down_proj, Int8Linear)  # 80 inputs: not whole groups of 32
    assert isinstance(model.model.embed_tokens, Int8Embedding) and isinstance(model.lm_head, Int8Linear)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one int8 table
    with pytest.raises(ValueError, match="4 or 8 bits"):
        quantise_weight_only(LlamaForCausalLM(config).eval(), bits=6)


def test_a_layers_output_is_within_the_weights_rounding_of_the_float_one():
    """Quality: 16 levels from a group of 32's smallest weight to its largest round a uniform
    weight to ~6% of its norm; the output is as far from the float output, the activations'
    int8 rounding adding next to nothing."""
    torch.manual_seed(0)
    linear = nn.Linear(1024, 512, bias=False)
    x = torch.randn(16, 1024)
    with torch.no_grad():
        exact = linear(x)
        rebuilt = dequantised(quantise_groups(linear.weight))
        weight_error = float((rebuilt - linear.weight).norm() / linear.weight.norm())
        output_error = float((Int4Linear.from_linear(linear)(x) - exact).norm() / exact.norm())
    assert 0.05 < weight_error < 0.065
    assert abs(output_error - weight_error) < 0.01


def test_weights_read_from_a_4_bit_file_come_back_almost_as_they_were():
    """A Q4_1 or Q4_K file's weights are a level (0-15) times a scale plus a minimum per 32: such
    weights, read back into a model and rounded again here, keep their levels (the scale and
    minimum coded in 8 bits move a level by far less than half)."""
    generator = torch.Generator().manual_seed(5)
    levels = torch.randint(0, 16, (64, 128), generator=generator).float()
    levels[:, ::GROUP], levels[:, 1::GROUP] = 0, 15  # each group uses its whole range
    scales = torch.rand(64, 4, generator=generator) * 0.01 + 0.001
    minimums = -torch.rand(64, 4, generator=generator) * 0.08
    weight = (levels.reshape(64, 4, GROUP) * scales[..., None] + minimums[..., None]).reshape(64, 128)
    again = quantise_groups(weight).levels
    assert float((again.float() == levels).float().mean()) > 0.99
