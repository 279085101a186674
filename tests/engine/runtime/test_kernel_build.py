"""The native kernels built ahead of time (kernel_build.py): every variant compiles with
-Wall -Werror whatever this CPU has, its library reports the ABI native_forward.py's ctypes
structs expect, and with no compiler anywhere the kernel and the native forward load the
prebuilt library and give the logits the compiled-at-first-use one gives.

Each test of one variant is named after it; those this CPU cannot run are skipped with the
CPU flags it lacks (an AMD Zen 4 has AVX-512 VNNI but not AVX-VNNI)."""
from __future__ import annotations

import ctypes
import os
import platform
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from engine.runtime import int8_kernel, kernel_build
from engine.runtime.cpu import cpu_flags
from engine.runtime.kernel_build import VARIANTS, Variant
from engine.runtime.native_forward import DecoderStruct, Int8Struct, LayerStruct

ROOT = Path(__file__).resolve().parents[3]
CAN_COMPILE = (sys.platform.startswith("linux") and platform.machine() == "x86_64"
               and shutil.which(kernel_build.compiler()) is not None)
pytestmark = pytest.mark.skipif(not CAN_COMPILE, reason=f"the kernels build on x86-64 Linux with a C compiler ({kernel_build.compiler()})")


def lacks(variant: Variant) -> list[str]:
    return sorted(variant.needs - cpu_flags())


def skip_unless_runnable(variant: Variant) -> None:
    if lacks(variant):
        pytest.skip(f"this CPU lacks {', '.join(lacks(variant))} for the {variant.name} build (built, not run)")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Every variant's library, built as packaging/setup.sh builds them, into a fresh folder."""
    folder = tmp_path_factory.mktemp("built")
    result = subprocess.run([sys.executable, "-m", "engine.runtime.kernel_build", str(folder)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    print(result.stdout)  # the variants built, in the test's output (-rP, or a failure)
    return folder


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module as a new process finds it: nothing loaded or tried yet."""
    for name, value in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None), ("_origin", None)):
        monkeypatch.setattr(int8_kernel, name, value)


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No C compiler on PATH or in CC, and an empty cache folder (TANDEM_HOME); returns the home."""
    home = tmp_path / "home"
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("TANDEM_HOME", str(home))
    return home


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_every_variant_builds_with_every_warning_an_error(built, variant):
    library = built / kernel_build.library_name(variant)
    assert library.read_bytes()[:4] == b"\x7fELF"
    assert sorted(path.name for path in built.iterdir()) == sorted(kernel_build.library_name(v) for v in VARIANTS)


class KernelVariants(UserWarning):
    """Which variants were built and which run here, for CI's log: `pytest -q`, as CI runs
    it, shows a warnings summary but neither skip reasons nor what a test prints."""


def test_the_output_names_the_variants_built_and_run(built):
    run = [variant.name for variant in VARIANTS if not lacks(variant)]
    not_run = [f"{variant.name} (this CPU lacks {', '.join(lacks(variant))})" for variant in VARIANTS if lacks(variant)]
    assert len(list(built.glob("*.so"))) == len(VARIANTS)
    warnings.warn(KernelVariants(f"native kernels built with -Wall -Werror: {', '.join(v.name for v in VARIANTS)}; "
                                 f"tested on this CPU: {', '.join(run) or 'none'}; not run: {', '.join(not_run) or 'none'}"))


def test_a_warning_fails_the_build(tmp_path):
    """What makes the test above able to fail: -Werror is on."""
    source = tmp_path / "warns.c"
    source.write_text("int tandem_unused(void) { int never_read = 1; return 0; }\n")
    with pytest.raises(kernel_build.BuildFailed, match="never_read"):
        kernel_build.compile_library(VARIANTS[-1], tmp_path / "warns.so", sources=(source,))


def test_a_rebuild_replaces_the_libraries_of_older_sources(tmp_path):
    stale = tmp_path / f"{kernel_build.LIBRARY_PREFIX}avx2-0000000000000000.so"
    stale.write_bytes(b"from sources since changed")
    kernel_build.build_all(tmp_path)
    assert not stale.exists() and len(list(tmp_path.glob("*.so"))) == len(VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_each_library_reports_the_abi_of_the_python_structs(built, variant):
    skip_unless_runnable(variant)  # its tandem_abi may use the variant's instructions
    library = ctypes.CDLL(str(built / kernel_build.library_name(variant)))
    header = (ROOT / "engine" / "runtime" / "tandem_abi.h").read_text()
    assert f"#define TANDEM_ABI_VERSION {int8_kernel.ABI_VERSION}\n" in header
    assert int8_kernel.abi(library) == {"version": int8_kernel.ABI_VERSION, "int8": ctypes.sizeof(Int8Struct),
                                        "layer": ctypes.sizeof(LayerStruct), "decoder": ctypes.sizeof(DecoderStruct)}


def test_a_library_of_another_abi_version_is_refused(fresh_kernel, monkeypatch):
    if not any(variant.needs <= cpu_flags() for variant in VARIANTS):
        pytest.skip("this CPU lacks avx2 and fma, which every build needs")
    monkeypatch.setattr(int8_kernel, "ABI_VERSION", int8_kernel.ABI_VERSION + 1)
    assert int8_kernel.unavailable_reason() == (
        f"the int8 kernel library has ABI version {int8_kernel.ABI_VERSION - 1}; this Tandem reads {int8_kernel.ABI_VERSION}")


def one_forwards_logits(seed: int) -> torch.Tensor:
    """Logits of a short context and a verify of three tokens on the native forward."""
    from .test_native_forward import VOCAB, int8_model, pair_of_runtimes

    native, _ = pair_of_runtimes(int8_model("llama", seed))
    rng = random.Random(seed)
    context = [rng.randrange(VOCAB) for _ in range(12)]
    return torch.cat([native.forward(context, logits_wanted=3), native.forward([1, 2, 3], logits_wanted=3)])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_without_a_compiler_the_prebuilt_library_runs_the_kernel_and_the_native_forward(
        built, variant, fresh_kernel, monkeypatch, tmp_path):
    skip_unless_runnable(variant)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: variant.needs)  # a CPU with only this variant's features
    if int8_kernel.unavailable_reason() is not None:
        pytest.skip(f"the int8 kernel does not run here: {int8_kernel.unavailable_reason()}")
    # 1. what the library the session loaded gives (prebuilt by setup, or compiled at first use)
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(1))
    weight = torch.randint(-127, 128, (40, 200), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    expected_product = int8_kernel.kernel_product(x, weight, int8_kernel.weight_row_sums(weight))
    expected_logits = one_forwards_logits(seed=3)
    # 2. a new process's first load, with no compiler anywhere and a fresh cache
    for name, value in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None), ("_origin", None)):
        monkeypatch.setattr(int8_kernel, name, value)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", built)
    assert int8_kernel.unavailable_reason() is None and int8_kernel.variant_name() == variant.name
    assert int8_kernel.library_origin() == f"prebuilt, {built / kernel_build.library_name(variant)}"
    # 3. the same floats
    assert torch.equal(int8_kernel.kernel_product(x, weight, int8_kernel.weight_row_sums(weight)), expected_product)
    assert torch.equal(one_forwards_logits(seed=3), expected_logits)
    assert not (tmp_path / "home" / "cache" / "kernels").exists()  # nothing was compiled


def test_without_a_prebuilt_library_or_a_compiler_the_reason_says_both(fresh_kernel, no_compiler, monkeypatch, tmp_path):
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", tmp_path / "none")
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: VARIANTS[-1].needs)
    reason = int8_kernel.unavailable_reason()
    assert "no prebuilt int8 kernel" in reason and "packaging/setup.sh" in reason and "no C compiler (no-such-compiler)" in reason


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_a_source_checkout_without_a_prebuilt_library_compiles_at_first_use(variant, fresh_kernel, monkeypatch, tmp_path):
    skip_unless_runnable(variant)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: variant.needs)
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", tmp_path / "none")
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    assert int8_kernel.unavailable_reason() is None
    cached = tmp_path / "home" / "cache" / "kernels" / kernel_build.library_name(variant)
    assert int8_kernel.library_origin().startswith("compiled at first use by ") and str(cached) in int8_kernel.library_origin()
    assert cached.exists()
