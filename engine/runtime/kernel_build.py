"""Builds Tandem's native kernels (the int8 product and the decoder forward, one shared library)
ahead of time, one library per ISA variant (AVX-512 VNNI with AMX, and with bf16 attention,
AVX-VNNI, AVX2 with FMA, and a portable one in plain C that any x86-64 CPU runs), as a
library's build does:

    python -m engine.runtime.kernel_build [OUT_DIR]     # default: engine/runtime/_built/

Why ahead of time: built at first use, the kernel needed a C compiler on the user's machine,
and without one the defaults changed silently (the native forward went away). Every variant
is compiled whatever this CPU has (compiling needs only the compiler's flags), with
`-Wall -Werror`, so a CPU the build machine lacks still gets a library, and a warning fails the
build where a developer sees it. packaging/setup.sh runs this; the wheel and the desktop bundle
carry what it built; int8_kernel.py loads the library of the variant cpuid chooses.

Each library's name holds a hash of its sources and flags (`library_name`): a library built
from other sources (a checkout pulled since setup) is never loaded for these ones.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """One build of the kernel: a source, the CPU features it needs, the flags that use them."""

    name: str
    source: Path
    needs: frozenset[str]
    flags: tuple[str, ...]
    # The most rows (tokens) it takes in an eager forward: past them the torch version is
    # faster (docs/bench/int8_matvec.py; measured against this development CPU's AVX-512
    # oneDNN, stronger than what a CPU of the variant's own kind has, so on the safe side).
    most_tokens: int
    # Whether a compiled one-token graph calls it (`integer_product`): measured for AVX-512
    # VNNI only (docs/BENCHMARKS.md); the others are not measured on a CPU of their kind.
    in_compiled_graphs: bool
    # Whether the native forward's attention multiplies in bf16 (simd.h, BF16_ATTENTION): its
    # logits then agree with the float32 builds' to bf16's rounding, not float32's.
    bf16_attention: bool = False


_HERE = Path(__file__).parent
# -fopenmp links libgomp.so.1, the OpenMP runtime torch's wheel loads under that name, so the
# kernel's threads are torch's own (clang's -fopenmp would bring a second runtime: use gcc).
# -ffp-contract=off: a fused multiply-add would round differently from torch.
CODE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
# Ahead of time only: a user's newer compiler may warn of something new, and that must not
# cost them the kernel when it falls back to building at first use.
STRICT_FLAGS = ("-Wall", "-Werror")
# The first variant this CPU has every feature of is loaded (int8_kernel.variant_for).
VARIANTS = (
    # AVX-512 VNNI's build whose attention multiplies in bf16 (simd.h, BF16_ATTENTION): a long
    # prompt's attention at twice float32's multiply-adds (Zen 4, Cooper Lake, Sapphire Rapids on).
    Variant("AVX-512 BF16", _HERE / "int8_matmul.c",
            frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "bmi2", "avx512_bf16"}),
            ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mbmi2", "-mavx512bf16"), most_tokens=16,
            in_compiled_graphs=True, bf16_attention=True),
    # AMX too, for 2 or more tokens, where the CPU and the OS allow it: int8_matmul.c compiles
    # its tile code with a target attribute and asks cpuid at run time.
    Variant("AVX-512 VNNI", _HERE / "int8_matmul.c", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "bmi2"}),
            ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mbmi2"), most_tokens=16, in_compiled_graphs=True),
    # FMA: the native forward's attention and e^x on 8 lanes (every AVX2 CPU but a few of 2013's has it)
    Variant("AVX-VNNI", _HERE / "int8_matmul_avx2.c", frozenset({"avx2", "fma", "avx_vnni"}), ("-mavx2", "-mfma", "-mavxvnni"),
            most_tokens=8, in_compiled_graphs=False),
    Variant("AVX2", _HERE / "int8_matmul_avx2.c", frozenset({"avx2", "fma"}), ("-mavx2", "-mfma"), most_tokens=4,
            in_compiled_graphs=False),
    # Plain C, no intrinsics (simd.h's one-lane helpers): any x86-64 CPU runs it, so it is last,
    # the fallback where no other fits, and the reference the tests compare the others with.
    # -march=x86-64: the baseline, even where a compiler defaults to a newer level. Its rows are
    # not measured on a CPU of its kind (none here); 64, the native forward's prompt pieces. (It
    # once also capped the native forward's rows on builds never measured: at 16, tree nodes got
    # other logits than the same tokens stepped after a prompt read partly in torch. The native
    # forward now takes every row count on every build: forward_plan.py.)
    Variant("portable", _HERE / "int8_matmul_portable.c", frozenset(), ("-march=x86-64",), most_tokens=64,
            in_compiled_graphs=False),
)
# Built into the same library: a whole decoder forward over the kernel (native_forward.py).
DECODER_SOURCE = _HERE / "decoder_forward.c"
# And the int4 layers' product (int4_weights.py), one source for every ISA.
INT4_SOURCE = _HERE / "int4_matmul.c"
ABI_HEADER = _HERE / "tandem_abi.h"  # the structs native_forward.py hands the forward
SIMD_HEADER = _HERE / "simd.h"  # the forward's per-ISA vector helpers
PREBUILT_DIR = _HERE / "_built"
LIBRARY_PREFIX = "tandem_kernels-"
BUILD_TIMEOUT_S = 120


class BuildFailed(Exception):
    pass


def compiler() -> str:
    return os.environ.get("CC", "cc")


def library_name(variant: Variant) -> str:
    """The file name of `variant`'s library built from the sources as they are now, e.g.
    tandem_kernels-avx2-0123456789abcdef.so (OSError where a source is missing)."""
    sources = b"".join(path.read_bytes() for path in (variant.source, DECODER_SOURCE, INT4_SOURCE, ABI_HEADER, SIMD_HEADER))
    key = hashlib.sha256(sources + " ".join((*CODE_FLAGS, *variant.flags)).encode()).hexdigest()[:16]
    return f"{LIBRARY_PREFIX}{re.sub(r'[^a-z0-9]+', '-', variant.name.lower())}-{key}.so"


def compile_library(variant: Variant, out: Path, warnings: tuple[str, ...] = STRICT_FLAGS,
                    sources: tuple[Path, ...] | None = None) -> None:
    """`variant`'s library at `out`, from its own, the decoder's and the int4 sources by default. It is
    written under a temporary name and renamed, so that another process building at the same
    time never loads a half-written file. BuildFailed says what the compiler said."""
    sources = sources or (variant.source, DECODER_SOURCE, INT4_SOURCE)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        partial = Path(scratch) / out.name
        command = [compiler(), *CODE_FLAGS, *warnings, *variant.flags, "-o", str(partial), *map(str, sources), "-lm"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=compiler_environment())
        except (OSError, subprocess.SubprocessError) as error:
            raise BuildFailed(f"building the int8 kernel ({variant.name}) failed: {error}") from error
        if result.returncode != 0:
            raise BuildFailed(f"building the int8 kernel ({variant.name}) failed: {result.stderr.strip()[-300:]}")
        os.replace(partial, out)


def build_all(out_dir: Path) -> list[Path]:
    """Every variant's library in `out_dir`, strictly (-Wall -Werror), in place of the ones
    built there before. Raises BuildFailed at the first variant that does not build."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(f"{LIBRARY_PREFIX}*.so"):
        stale.unlink()
    built = []
    for variant in VARIANTS:
        library = out_dir / library_name(variant)
        compile_library(variant, library)
        built.append(library)
    return built


def compiler_environment() -> dict[str, str]:
    """The environment without a PyInstaller bundle's library path: the bundle's own libz or
    libstdc++ can break the compiler's programs (the bootloader keeps the user's value in
    LD_LIBRARY_PATH_ORIG)."""
    environment = dict(os.environ)
    if getattr(sys, "frozen", False):
        original = environment.pop("LD_LIBRARY_PATH_ORIG", None)
        environment.pop("LD_LIBRARY_PATH", None)
        if original is not None:
            environment["LD_LIBRARY_PATH"] = original
    return environment


def main(arguments: list[str]) -> int:
    out_dir = Path(arguments[0]) if arguments else PREBUILT_DIR
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        print("The native kernels are built for Linux on x86-64 only; elsewhere torch does their work.")
        return 0
    try:
        built = build_all(out_dir)
    except BuildFailed as error:
        print(error, file=sys.stderr)
        return 1
    for variant, library in zip(VARIANTS, built):
        print(f"built {variant.name}: {library}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
