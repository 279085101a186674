"""The forward plan: which engine runs which rows of a tiny random model, and why, under the
settings that change it; and the static runtime running the very engine the plan names."""
from __future__ import annotations

import logging

import pytest
import torch

from engine.models import LoadedModel
from engine.runtime import int8_kernel
from engine.runtime.forward_plan import (
    COMPILED, CUDA_GRAPHS, EAGER, NATIVE, STATIC_EAGER, ForwardPlan, ForwardSettings, RowRange, plan_forward,
)
from engine.runtime.int8_weights import quantise_weight_only
from engine.runtime.native_forward import NATIVE_NAME, NativeForward
from engine.runtime.static_cache_forward import StaticCacheForward
from engine.runtime.torch_static import StaticTorchRuntime

from ..tiny_models import tiny_llama

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # planning never touches the GPU: it only chooses
kernel_builds = pytest.mark.skipif(int8_kernel.unavailable_reason() is not None,
                                   reason=f"the int8 kernel does not run here: {int8_kernel.unavailable_reason()}")


def int8_llama(seed: int = 2) -> torch.nn.Module:
    return quantise_weight_only(tiny_llama(seed=seed, vocab_size=64, hidden=64))


@kernel_builds
def test_an_int8_llama_on_the_cpu_runs_natively_where_the_kernel_builds():
    plan = plan_forward(int8_llama(), CPU)
    assert plan.name == NATIVE_NAME and plan.engines == {NATIVE} and plan.static_cache
    assert plan.engine_for(1) == plan.engine_for(64) == NATIVE
    reason = plan.ranges[0].reason
    assert int8_kernel.variant_name() in reason and "on the CPU" in reason
    assert plan.precision == "int8-wo" and plan.kernel == int8_kernel.variant_name()
    assert plan.describe().startswith(f"{NATIVE_NAME}: native C for every row count")


@kernel_builds
def test_an_int4_llama_on_the_cpu_runs_natively_and_names_its_precision():
    plan = plan_forward(quantise_weight_only(tiny_llama(seed=2, vocab_size=64, hidden=64), bits=4), CPU)
    assert plan.name == NATIVE_NAME and plan.engines == {NATIVE}
    assert plan.precision == "int4-wo"


@kernel_builds
@pytest.mark.parametrize(("bf16", "said"), [(True, "attention and its KV cache in bf16"),
                                            (False, "float32 between the products")])
def test_the_native_plan_says_what_its_build_computes_attention_in(bf16, said, monkeypatch):
    """The AVX-512 BF16 build's attention is bf16 (docs/BENCHMARKS.md): the plan, and so the
    speed panel, `tandem bench` and `tandem tune`, say so."""
    monkeypatch.setattr(int8_kernel, "attention_in_bf16", lambda: bf16)
    reason = plan_forward(int8_llama(), CPU).ranges[0].reason
    assert said in reason


def test_without_the_kernel_the_plan_is_torch_and_says_why(monkeypatch):
    monkeypatch.setattr(int8_kernel, "unavailable_reason", lambda: "no C compiler (cc) to build the int8 kernel")
    monkeypatch.setattr(int8_kernel, "variant_name", lambda: None)
    plan = plan_forward(int8_llama(), CPU)
    assert plan.name == "torch" and plan.engines == {EAGER} and not plan.static_cache
    assert "not native: no C compiler" in plan.ranges[0].reason
    assert plan.kernel is None and "no kernel: no C compiler" in plan.kernel_reason


@kernel_builds
@pytest.mark.parametrize(("build", "said"), [("AVX2", "measured faster than llama.cpp"), ("portable", "never measured")])
def test_a_build_never_measured_runs_every_row_natively_too_and_says_so(build, said, monkeypatch):
    monkeypatch.setattr(int8_kernel, "variant_name", lambda: build)
    plan = plan_forward(int8_llama(), CPU, ForwardSettings(compile=True))
    assert plan.engines == {NATIVE}  # prompt pieces of 64: no row left to compile
    assert said in plan.ranges[0].reason


def test_settings_change_the_plan(monkeypatch):
    float_model = tiny_llama(seed=3)
    assert plan_forward(float_model, CPU).engines == {EAGER}
    compiled = plan_forward(float_model, CPU, ForwardSettings(compile=True))
    assert compiled.name == "torch (static cache)" and compiled.engines == {COMPILED} and compiled.static_cache
    assert plan_forward(float_model, CPU, ForwardSettings(static_cache=True)).engines == {STATIC_EAGER}
    assert plan_forward(float_model, CUDA).engines == {CUDA_GRAPHS}
    assert plan_forward(float_model, CUDA, ForwardSettings(graphs=False)).name == "torch"
    # the switches that hold for every pair
    monkeypatch.setenv("TANDEM_COMPILE", "0")
    assert plan_forward(float_model, CPU, ForwardSettings.for_pair(compile=True)).engines == {EAGER}
    monkeypatch.setenv("TANDEM_COMPILE", "1")
    assert plan_forward(float_model, CPU, ForwardSettings.for_pair(compile=True)).engines == {COMPILED}
    monkeypatch.setenv("TANDEM_CUDA_GRAPHS", "0")
    off = plan_forward(float_model, CUDA, ForwardSettings.for_pair(compile=False))
    assert off.engines == {EAGER} and "TANDEM_CUDA_GRAPHS=0" in off.ranges[0].reason
    # the precision the loader chose, with its reason
    chosen = plan_forward(float_model, CPU, ForwardSettings(precision="bf16", precision_reason="the pair's setting"))
    assert "precision bf16 (the pair's setting)" in chosen.describe()


@kernel_builds
def test_kept_in_torch_an_int8_model_names_the_kernels_rows_in_torch():
    plan = plan_forward(int8_llama(), CPU, ForwardSettings(native=False, static_cache=True))
    assert plan.engines == {STATIC_EAGER} and "kept in torch" in plan.ranges[0].reason
    assert f"up to {int8_kernel.most_tokens()} rows" in plan.kernel_reason


def counting(monkeypatch) -> dict[str, list[int]]:
    """Rows per call of the native forward and of the static torch forward."""
    calls: dict[str, list[int]] = {NATIVE: [], "torch": []}
    native_call, torch_call = NativeForward.__call__, StaticCacheForward.__call__
    monkeypatch.setattr(NativeForward, "__call__", lambda self, ids, *rest: calls[NATIVE].append(len(ids)) or native_call(self, ids, *rest))
    monkeypatch.setattr(StaticCacheForward, "__call__",
                        lambda self, ids, *rest: calls["torch"].append(len(ids)) or torch_call(self, ids, *rest))
    return calls


def plan_of(*ranges: tuple[int | None, str]) -> ForwardPlan:
    return ForwardPlan("test plan", tuple(RowRange(most, engine, "the test's") for most, engine in ranges), "int8-wo", "")


@kernel_builds
@pytest.mark.parametrize(("ranges", "native_rows", "torch_buckets"), [
    ([(None, NATIVE)], [10, 1, 1], []),
    ([(None, STATIC_EAGER)], [], [16, 1, 1]),  # torch pads 10 rows up to their bucket
    ([(4, NATIVE), (None, STATIC_EAGER)], [1, 1], [16]),  # a prompt in torch, the steps in C
])
def test_the_runtime_runs_the_engine_its_plan_names(ranges, native_rows, torch_buckets, monkeypatch):
    calls = counting(monkeypatch)
    runtime = StaticTorchRuntime(int8_llama(), CPU, 100, plan=plan_of(*ranges))
    assert (runtime.native is not None) == any(engine == NATIVE for _, engine in ranges)
    runtime.forward(list(range(10)))
    runtime.forward([11])
    runtime.forward([12])
    assert calls[NATIVE] == native_rows and calls["torch"] == torch_buckets


def test_a_loaded_model_logs_its_plan_once_and_opens_the_runtime_it_names(caplog):
    with caplog.at_level(logging.INFO, logger="tandem.models"):
        loaded = LoadedModel(tiny_llama(seed=4), None, CPU, torch.float32, "fp32", "tiny", context_length=96)
        runtimes = [loaded.open_runtime() for _ in range(2)]
    logged = [record.getMessage() for record in caplog.records if record.name == "tandem.models"]
    assert logged == [f"tiny: {loaded.forward_plan.describe()}"]
    assert loaded.forward_plan_line == loaded.forward_plan.describe() and loaded.forward_plan.engines == {EAGER}
    assert all(not isinstance(runtime, StaticTorchRuntime) for runtime in runtimes)
