"""Tandem's int8 kernel: the floats its torch version gives (the same integer sums, the same
rounding), for every shape a model has; or the torch version, with the reason, where the kernel
cannot run."""
from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch

from engine.runtime import int8_kernel
from engine.runtime.cpu import cpu_flags
from engine.runtime.int8_kernel import (
    VARIANTS, Variant, integer_product, kernel_product, torch_product, unavailable_reason, variant_name, weight_row_sums,
)

CAN_BUILD = unavailable_reason() is None  # a prebuilt library, or a compiler to build one, on a CPU it runs on
NO_KERNEL = f"the int8 kernel does not run here: {unavailable_reason()}"


def each_runnable(variant: Variant):
    """`variant` as a test parameter, skipped with the CPU flags it needs and this CPU lacks:
    every variant is tested where the CPU has it (an AVX-512 CPU runs all three), and the test
    output says which were not, and why."""
    missing = sorted(variant.needs - cpu_flags())
    reason = f"this CPU lacks {', '.join(missing)} for the {variant.name} build" if missing else NO_KERNEL
    return pytest.param(variant, id=variant.name, marks=pytest.mark.skipif(bool(missing) or not CAN_BUILD, reason=reason))


ALL_VARIANTS = [each_runnable(variant) for variant in VARIANTS]


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module as a new process finds it: nothing loaded or tried yet."""
    monkeypatch.setattr(int8_kernel, "_tried", False)
    monkeypatch.setattr(int8_kernel, "_library", None)
    monkeypatch.setattr(int8_kernel, "_reason", None)
    monkeypatch.setattr(int8_kernel, "_variant", None)


@pytest.fixture(params=ALL_VARIANTS)
def each_variant(request, fresh_kernel, monkeypatch: pytest.MonkeyPatch) -> Variant:
    """The kernel as a CPU with only this variant's features builds it."""
    variant = request.param
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: variant.needs)
    assert unavailable_reason() is None and variant_name() == variant.name
    return variant


def random_int8(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """As LLMs make them: a few channels tens of times larger than the rest."""
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    x[:, :2] *= 60.0
    return x


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
def test_the_kernel_is_built_and_used_where_the_cpu_and_a_compiler_allow():
    assert unavailable_reason() is None
    x, weight = activations(2, 64, seed=0), random_int8(16, 64, seed=1)
    calls = []
    original = torch._int_mm
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "_int_mm", lambda *args: calls.append(1) or original(*args))
        assert torch.equal(integer_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    assert calls == [1]  # torch_product's, not integer_product's: the kernel did that one


# Widths and heights around the kernel's 64-byte chunks and 16-row blocks, and the demo
# target's own shapes (576 wide, 1536 wide; 960 = its q/k/v joined).
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 20])
@pytest.mark.parametrize("width, outputs", [(1, 1), (4, 16), (31, 7), (63, 17), (64, 16), (65, 33), (80, 48), (576, 960), (1536, 576), (200, 5)])
def test_the_kernel_gives_the_torch_versions_floats_for_every_shape(each_variant, rows, width, outputs):
    x, weight = activations(rows, width, seed=rows), random_int8(outputs, width, seed=width)
    weight[0, :] = -127  # the extremes: the kernel shifts the rounded activations by 128 and takes it back
    weight[-1, :] = 127
    out = kernel_product(x, weight, weight_row_sums(weight))
    assert out.dtype == torch.float32 and torch.equal(out, torch_product(x, weight))


def test_the_kernel_rounds_values_a_division_by_the_scale_would_round_otherwise(each_variant):
    """Both versions multiply by the scale's reciprocal. Values within a few ulps of a level's
    half-way point, where a division rounds some of them the other way, make a kernel that
    divided disagree with torch_product."""
    largest = torch.tensor(1.3)
    scale = largest / 127.0  # the scale of a row whose largest value is 1.3
    near = (torch.arange(-126, 126, dtype=torch.float32) + 0.5) * scale
    above, below = [near], [near]
    for _ in range(4):
        above.append(torch.nextafter(above[-1], torch.tensor(float("inf"))))
        below.append(torch.nextafter(below[-1], torch.tensor(float("-inf"))))
    candidates = torch.cat(above + below)
    differ = candidates[torch.round(candidates / scale) != torch.round(candidates * (1.0 / scale))][:63]
    assert len(differ) >= 8  # what makes this test able to fail
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1 : 1 + len(differ)] = largest, differ
    weight = torch.eye(64, dtype=torch.int8) * 127  # each output reads one value's levels
    assert torch.equal(kernel_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))


@pytest.mark.parametrize("seed", range(3))
def test_the_product_is_the_float_product_up_to_the_activations_second_rounding(seed):
    x, weight = activations(4, 256, seed=seed), random_int8(96, 256, seed=seed)
    reference = x @ weight.float().T
    assert (integer_product(x, weight, weight_row_sums(weight)) - reference).abs().max() < 1e-3 * reference.abs().max()


def test_every_build_gives_the_portable_builds_floats(each_variant, monkeypatch):
    """The portable build (plain C, no intrinsics) is the reference: every build this CPU runs
    gives its floats to the bit, at one token and at a verify's, on the demo target's shapes."""
    x, weight = activations(9, 1536, seed=21), random_int8(576, 1536, seed=22)
    built = [kernel_product(x[:rows], weight, weight_row_sums(weight)) for rows in (1, 9)]
    for name, fresh in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
        monkeypatch.setattr(int8_kernel, name, fresh)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: frozenset())
    assert variant_name() == "portable"
    for rows, product in zip((1, 9), built):
        assert torch.equal(kernel_product(x[:rows], weight, weight_row_sums(weight)), product), (each_variant.name, rows)


def test_a_weight_given_as_rows_of_a_larger_one_is_read_in_place(each_variant):
    """Joined layers (int8_weights.join_rows) hand each part a view of their rows, and column
    slices have a row stride wider than their width."""
    whole = random_int8(96, 128, seed=3)
    x = activations(4, 64, seed=4)
    for weight in (whole[16:80, :64], whole[5:37, 64:]):
        assert torch.equal(kernel_product(x, weight, weight_row_sums(weight)), torch_product(x, weight.contiguous()))


def test_a_row_is_the_same_floats_alone_or_in_a_batch_of_any_size():
    weight = random_int8(100, 300, seed=6)
    batch = activations(max(variant.most_tokens for variant in VARIANTS) + 4, 300, seed=7)  # the torch version runs the batch
    together = integer_product(batch, weight, weight_row_sums(weight))
    for row in range(batch.shape[0]):
        assert torch.equal(integer_product(batch[row : row + 1], weight, weight_row_sums(weight)), together[row : row + 1])
    assert torch.equal(integer_product(batch[1:4], weight, weight_row_sums(weight)), together[1:4])


def test_rows_of_zeros_tiny_values_and_a_nan_come_out_as_torch_gives_them(each_variant):
    weight = random_int8(40, 80, seed=15)
    x = activations(4, 80, seed=16)
    x[1] = 0.0
    x[2] *= 1e-35  # below the smallest scale torch allows (1e-30 / 127)
    x[3, 7] = float("nan")
    out, reference = kernel_product(x, weight, weight_row_sums(weight)), torch_product(x, weight)
    assert torch.equal(out[:3], reference[:3])
    assert out[3].isnan().all() and reference[3].isnan().all()  # a broken model's NaN is not rounded away


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
def test_the_product_is_the_same_from_another_thread_and_with_one_thread():
    """The runtimes decode on a worker thread; the kernel's OpenMP threads are torch's."""
    x, weight = activations(3, 576, seed=17), random_int8(960, 576, seed=18)
    expected = torch_product(x, weight)
    results = []
    worker = threading.Thread(target=lambda: results.append(kernel_product(x, weight, weight_row_sums(weight))))
    worker.start()
    worker.join()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results.append(kernel_product(x, weight, weight_row_sums(weight)))
    finally:
        torch.set_num_threads(threads)
    assert len(results) == 2 and all(torch.equal(result, expected) for result in results)


def test_operands_that_do_not_fit_are_refused_before_the_kernel_reads_them():
    x, weight = activations(2, 64, seed=19), random_int8(16, 96, seed=20)
    with pytest.raises(RuntimeError, match="width 64 against a weight of width 96"):
        torch.ops.tandem.int8_product.default(x, weight, weight_row_sums(weight))
    with pytest.raises(RuntimeError, match="float32 rows and an int8 weight"):
        torch.ops.tandem.int8_product.default(x.double(), weight[:, :64].contiguous(), weight_row_sums(weight[:, :64]))


def test_without_a_library_or_a_compiler_oneDNN_does_the_product_and_the_reason_is_kept(fresh_kernel, monkeypatch, tmp_path):
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", tmp_path)  # no prebuilt library
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(int8_kernel.sys, "platform", "linux")
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: VARIANTS[0].needs)  # the compiler is what is missing
    x, weight = activations(2, 64, seed=8), random_int8(16, 64, seed=9)
    assert torch.equal(integer_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    assert "no C compiler (no-such-compiler)" in unavailable_reason()


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
@pytest.mark.parametrize("flags", [{"sse4_2", "avx", "fma"}, {"sse4_2", "avx", "avx2"}, set()],
                         ids=["no AVX2", "AVX2 without FMA", "no flags at all"])
def test_a_cpu_without_avx2_and_fma_runs_the_portable_build(fresh_kernel, monkeypatch, flags):
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: frozenset(flags))
    x, weight = activations(3, 70, seed=10), random_int8(20, 70, seed=11)
    assert torch.equal(kernel_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    assert unavailable_reason() is None and variant_name() == "portable"


def test_off_x86_64_oneDNN_does_the_product_and_says_why(fresh_kernel, monkeypatch):
    """The builds are compiled and tested for x86-64 Linux only: elsewhere torch runs the product."""
    monkeypatch.setattr(int8_kernel.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: frozenset())
    x, weight = activations(3, 70, seed=10), random_int8(20, 70, seed=11)
    assert torch.equal(integer_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    assert unavailable_reason() == "the int8 kernel is built for Linux on x86-64 only" and variant_name() is None


def test_the_portable_build_is_last_so_that_it_runs_only_where_no_other_fits():
    assert VARIANTS[-1].name == "portable" and VARIANTS[-1].needs == frozenset()
    assert all(variant.needs for variant in VARIANTS[:-1])
    assert int8_kernel.variant_for(frozenset({"avx2", "fma"})).name == "AVX2"


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
def test_the_environment_can_name_a_narrower_build_or_turn_the_kernel_off(fresh_kernel, monkeypatch):
    """TANDEM_INT8_KERNEL: what a CPU with fewer features runs, measured on this one; or off.
    The portable build runs on every CPU."""
    x, weight = activations(3, 70, seed=12), random_int8(20, 70, seed=13)
    monkeypatch.setenv("TANDEM_INT8_KERNEL", "Portable")
    assert variant_name() == "portable" and unavailable_reason() is None
    assert torch.equal(integer_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    for value, reason in (("off", "turned off (TANDEM_INT8_KERNEL=off)"),
                          ("SSE2", "TANDEM_INT8_KERNEL='SSE2' names no build of the int8 kernel (one of AVX-512 BF16, AVX-512 VNNI, AVX-VNNI, AVX2, portable, or off)")):
        for name, fresh in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
            monkeypatch.setattr(int8_kernel, name, fresh)
        monkeypatch.setenv("TANDEM_INT8_KERNEL", value)
        assert torch.equal(integer_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
        assert variant_name() is None and reason in unavailable_reason()


def test_a_build_the_cpu_cannot_run_is_refused_with_what_it_lacks(fresh_kernel, monkeypatch):
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setenv("TANDEM_INT8_KERNEL", "AVX-VNNI")  # needs avx_vnni too
    assert unavailable_reason() == "TANDEM_INT8_KERNEL='AVX-VNNI': this CPU lacks avx_vnni" and variant_name() is None


@pytest.mark.skipif(not CAN_BUILD, reason=NO_KERNEL)
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler to build the kernel at first use")
def test_a_corrupt_cached_library_is_built_again(fresh_kernel, monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))  # a path this process has not loaded yet
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", tmp_path / "no-prebuilt-libraries")
    library = int8_kernel._built(int8_kernel.chosen_variant())
    library.write_bytes(b"not a shared library")
    x, weight = activations(2, 64, seed=12), random_int8(16, 64, seed=13)
    assert torch.equal(kernel_product(x, weight, weight_row_sums(weight)), torch_product(x, weight))
    assert unavailable_reason() is None and library.read_bytes()[:4] == b"\x7fELF"


def test_a_compiled_graph_calls_the_kernel_for_one_token_and_fuses_torchs_rounding_for_more(each_variant):
    """torch.compile keeps the operator opaque (its fake gives the shape) in the one-token
    graph, for the variants measured to pay there; a graph of several tokens traces
    torch_product instead. Every graph gives the eager floats."""
    weight = random_int8(48, 96, seed=14)
    operators = []

    def recording(graph: torch.fx.GraphModule, inputs):
        operators.append({str(node.target) for node in graph.graph.nodes if node.op == "call_function"})
        return graph.forward

    torch._dynamo.reset()  # the graphs of another variant's run are guarded on that variant
    compiled = torch.compile(lambda x: integer_product(x, weight, weight_row_sums(weight)) * 0.5, backend=recording, dynamic=True, fullgraph=True)
    for rows in (1, 5):
        x = activations(rows, 96, seed=rows)
        assert torch.equal(compiled(x), torch_product(x, weight) * 0.5)
    assert len(operators) == 2
    assert ("tandem.int8_product.default" in operators[0]) == each_variant.in_compiled_graphs
    assert "tandem.int8_product.default" not in operators[1] and any("_int_mm" in target for target in operators[1])


@pytest.mark.skipif(not CAN_BUILD or "amx_int8" not in cpu_flags(), reason=NO_KERNEL if not CAN_BUILD else "this CPU lacks amx_int8 (AMX)")
@pytest.mark.parametrize("rows, width", [(100, 128), (49152 // 64, 576), (576, 1536), (33, 64)])
def test_amx_gives_the_vector_paths_floats_to_the_bit(rows, width):
    """Tokens past the first run on AMX's tiles where the CPU has them: the same integer sums,
    scaled alike, so the same floats as the vector path, for every token count (groups of 8
    tokens, a last group part full) and a last block of fewer than 16 weight rows."""
    assert int8_kernel.use_amx(True), "AMX is on this CPU, but the kernel does not use it"
    weight = random_int8(rows, width + 64, seed=rows)[:, :width]  # rows further apart than they are long
    sums = weight_row_sums(weight.contiguous())
    try:
        for tokens in (2, 3, 8, 9, 16, 17):
            x = activations(tokens, width, seed=tokens)
            int8_kernel.use_amx(True)
            on_tiles = kernel_product(x, weight, sums)
            int8_kernel.use_amx(False)
            assert not int8_kernel.use_amx()  # asking changes nothing
            on_vectors = kernel_product(x, weight, sums)
            assert torch.equal(on_tiles, on_vectors), tokens
            assert torch.equal(on_tiles, torch_product(x, weight)), tokens
    finally:
        int8_kernel.use_amx(True)
