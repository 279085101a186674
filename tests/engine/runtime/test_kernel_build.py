"""The native kernels built ahead of time (kernel_build.py): every variant compiles with
-Wall -Werror whatever this CPU has, its library reports the ABI kernel_abi.py's ctypes structs
expect (a library built from another layout is refused at load, saying what differs), and with
no compiler anywhere the kernel and the native forward load the prebuilt library and give the
logits the compiled-at-first-use one gives.

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

from engine.runtime import int8_kernel, kernel_abi, kernel_build
from engine.runtime.cpu import cpu_flags
from engine.runtime.kernel_build import VARIANTS, Variant

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
    everywhere = [variant.name for variant in VARIANTS if not variant.needs]
    assert everywhere == ["portable"] and set(everywhere) <= set(run)
    warnings.warn(KernelVariants(f"native kernels built with -Wall -Werror: {', '.join(v.name for v in VARIANTS)}; "
                                 f"tested on this CPU: {', '.join(run) or 'none'} ({', '.join(everywhere)}: on every CPU, "
                                 f"the reference the others are compared with); not run: {', '.join(not_run) or 'none'}"))


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
    assert f"#define TANDEM_ABI_VERSION {kernel_abi.ABI_VERSION}\n" in header
    expected = kernel_abi.expected_abi()
    assert len(expected) == 4 + 8 + 10 + 18  # the version, 3 sizes, every field of the 3 structs
    assert kernel_abi.reported_abi(library) == [value for _, value in expected]
    assert kernel_abi.mismatch(library) is None


def test_a_library_of_another_abi_version_is_refused(fresh_kernel, monkeypatch):
    monkeypatch.setattr(kernel_abi, "ABI_VERSION", kernel_abi.ABI_VERSION + 1)
    assert int8_kernel.unavailable_reason() == (
        f"the int8 kernel library has ABI version {kernel_abi.ABI_VERSION - 1}; this Tandem reads {kernel_abi.ABI_VERSION}")


# tandem_abi.h changed on the C side only, its version kept: what a field added or two fields
# swapped there without the same change in kernel_abi.py would build, and what the refusal says.
PLANTED = {
    "a field added": ("    void *keys, *values;", "    void *keys, *values;\n    int64_t planted;",
                      f"sizeof(TandemLayer) is {ctypes.sizeof(kernel_abi.LayerStruct) + 8} "
                      f"where this Tandem's ctypes structs have {ctypes.sizeof(kernel_abi.LayerStruct)}"),
    "two fields swapped": ("    const float *cos, *sin;", "    const float *sin, *cos;",
                           f"offsetof(TandemDecoder, cos) is {kernel_abi.DecoderStruct.sin.offset} "
                           f"where this Tandem's ctypes structs have {kernel_abi.DecoderStruct.cos.offset}"),
}


@pytest.mark.parametrize("plant", sorted(PLANTED))
def test_a_library_whose_structs_differ_is_refused_saying_what_differs_and_torch_runs(
        plant, fresh_kernel, monkeypatch, tmp_path):
    before, after, differs = PLANTED[plant]
    sources = tmp_path / "sources"
    sources.mkdir()
    portable = VARIANTS[-1]
    for path in (portable.source, kernel_build.DECODER_SOURCE, kernel_build.INT4_SOURCE, kernel_build.SIMD_HEADER,
                 kernel_build.ABI_HEADER):
        shutil.copy(path, sources / path.name)
    header = sources / kernel_build.ABI_HEADER.name
    assert before in header.read_text()
    header.write_text(header.read_text().replace(before, after))
    # built where the runtime looks for its prebuilt library, under the name of these sources'
    prebuilt = tmp_path / "built"
    kernel_build.compile_library(portable, prebuilt / kernel_build.library_name(portable),
                                 sources=(sources / portable.source.name, sources / kernel_build.DECODER_SOURCE.name,
                                          sources / kernel_build.INT4_SOURCE.name))
    monkeypatch.setattr(int8_kernel, "PREBUILT_DIR", prebuilt)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: portable.needs)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # and no compiler to build a good one
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    assert int8_kernel.unavailable_reason() == (
        f"the int8 kernel library's {differs} (tandem_abi.h and engine/runtime/kernel_abi.py differ)")
    assert int8_kernel.variant_name() is None and int8_kernel.loaded_library() is None
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))
    weight = torch.randint(-127, 128, (16, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(int8_kernel.integer_product(x, weight, int8_kernel.weight_row_sums(weight)),
                       int8_kernel.torch_product(x, weight))


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
