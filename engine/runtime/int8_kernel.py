"""The int8 layers' product on the CPU for a few tokens: Tandem's own AVX-512 VNNI kernel
(`int8_matmul.c`), built with the machine's C compiler on first use.

Why: one token's forward is a matrix-vector product per layer. oneDNN's `torch._int_mm`
reads the weights there at about half the bandwidth two cores have (docs/BENCHMARKS.md); this
kernel streams each weight row once, at the memory's speed. It also rounds the activations
itself: in the compiled graph that rounding was a few small kernels per layer, each costing
about its own launch at one token.

- It gives the same floats as `torch_product`, its torch version (the same int32 sums, the
  same float32 rounding, operation for operation), so which of the two runs never changes a
  logit, and a token's row stays the same in any batch.
- Past `MOST_TOKENS` rows (long verifies, prompt chunks) oneDNN's blocked GEMM is faster, and
  `torch_product` takes over; in a compiled graph the kernel runs one-token forwards only
  (`integer_product` says why).
- Where the kernel cannot run (no AVX-512 VNNI, not Linux, no C compiler, a failed build),
  `torch_product` does the work; `unavailable_reason()` says why.
- The product is a torch operator, so torch.compile keeps it as one opaque call in the graph.
- The built library is cached per source and flags under Tandem's cache folder; a build takes
  about a second, once per machine.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from .. import paths
from .cpu import cpu_flags

SOURCE = Path(__file__).with_name("int8_matmul.c")
NEEDED_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "bmi2"})
# -fopenmp links libgomp.so.1, the OpenMP runtime torch's wheel loads under that name, so the
# kernel's threads are torch's own (clang's -fopenmp would bring a second runtime: use gcc).
COMPILER_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mbmi2", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
BUILD_TIMEOUT_S = 120
# Whether a compiled one-token forward calls the kernel. Read while tracing, so dynamo keeps a
# graph per value: docs/bench/int8_kernel_step.py compiles both and times them call by call.
KERNEL_IN_ONE_TOKEN_GRAPHS = True
# The most rows (tokens) the kernel takes outside a compiled graph: past them oneDNN's
# blocked GEMM is faster (docs/bench/int8_matvec.py).
MOST_TOKENS = 6

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_reason: str | None = None  # why the kernel is not used; None until the first attempt
_tried = False


def integer_product(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
    """x @ weight.T in float32 for float rows x (m, k) and an int8 weight (n, k) whose rows sum
    to `row_sums` (int32, `weight_row_sums`), by an integer matmul with int32 sums.

    Each row is rounded to int8 twice: once at its own scale (max |x| / 127), then what that
    left over at the leftover's scale. One level alone costs a 135M model a tenth of its
    top-1 agreement with its float self (outlier channels flatten the rest of the row); two
    levels measure the same as the float activations (docs/BENCHMARKS.md). The sums are exact
    and each row is rounded on its own, so a row's product never depends on the rows batched
    with it: a verify of k tokens gives each token the logits a one-token step gives it.

    Which runs it: the kernel for up to MOST_TOKENS rows. Inside a compiled graph only for one
    row: there inductor fuses torch_product's rounding into the kernels around it, and for a
    verify of several tokens that costs less than the kernel's own rounding (docs/BENCHMARKS.md).
    The row count is a constant of the one-token graph, so the choice adds no graph."""
    x = x.float()
    if torch.compiler.is_compiling():  # torch_static loads the kernel before it compiles
        use_kernel = x.shape[0] == 1 and KERNEL_IN_ONE_TOKEN_GRAPHS and _library is not None
    else:
        use_kernel = x.shape[0] <= MOST_TOKENS and _loaded() is not None
    return torch.ops.tandem.int8_product.default(x, weight, row_sums) if use_kernel else torch_product(x, weight)


def weight_row_sums(weight: torch.Tensor) -> torch.Tensor:
    """What the kernel needs kept with an int8 weight: each row's sum, as int32."""
    return weight.sum(dim=1, dtype=torch.int32)


def torch_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """integer_product in torch: both levels through one `torch._int_mm` as 2n rows. The
    kernel rounds as this does, operation for operation, and gives the same floats."""
    first_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    first = torch.round(x / first_scale)
    leftover = x - first * first_scale
    second_scale = leftover.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    second = torch.round(leftover / second_scale)
    sums = torch._int_mm(torch.cat([first, second]).to(torch.int8), weight.t()).float()
    count = x.shape[0]
    return sums[:count] * first_scale + sums[count:] * second_scale


def kernel_product(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
    """integer_product by the kernel, for any number of rows (where `unavailable_reason()` is None).

    Written for the per-call cost: a one-token forward makes 121 of these calls, each a few
    microseconds of work, so every check here is a plain comparison (torch._check with its
    message closures cost 6 µs a call)."""
    library = _library if _tried else _loaded()
    if library is None:
        raise RuntimeError(f"the int8 kernel is not available: {_reason}")
    if not (x.is_cpu and weight.is_cpu and x.dtype == torch.float32 and weight.dtype == torch.int8
            and x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1]
            and row_sums.dtype == torch.int32 and row_sums.shape == weight.shape[:1] and row_sums.is_contiguous()):
        _check_operands(x, weight, row_sums)  # raises, saying what does not fit: the C code trusts its pointers and sizes
    if not x.is_contiguous():
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    rows, width = x.shape
    outputs = weight.shape[0]
    out = torch.empty((rows, outputs), dtype=torch.float32)
    failed = library.tandem_int8_product(
        x.data_ptr(), rows, width, weight.data_ptr(), outputs, weight.stride(0), row_sums.data_ptr(), out.data_ptr(),
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("out of memory for the int8 product's rounded activations")
    return out


def _check_operands(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> None:
    torch._check(x.dim() == 2 and weight.dim() == 2, lambda: "the int8 product takes (m, k) rows and an (n, k) weight")
    torch._check(x.shape[1] == weight.shape[1], lambda: f"rows of width {x.shape[1]} against a weight of width {weight.shape[1]}")
    torch._check(x.dtype == torch.float32 and weight.dtype == torch.int8, lambda: f"float32 rows and an int8 weight, not {x.dtype} and {weight.dtype}")
    torch._check(x.device.type == "cpu" and weight.device.type == "cpu", lambda: "the int8 kernel runs on the CPU")
    torch._check(row_sums.dtype == torch.int32 and row_sums.shape == weight.shape[:1] and row_sums.is_contiguous(),
                 lambda: "the weight's row sums: one contiguous int32 per row (weight_row_sums)")


def _int8_product(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
    if (_library if _tried else _loaded()) is None:
        return torch_product(x, weight)
    return kernel_product(x, weight, row_sums)


# Defined with the low-level registration: torch.library.custom_op wraps each call in ~10 µs
# more Python, and a forward of the demo target makes 121 of them.
_operators = torch.library.Library("tandem", "DEF")
_operators.define("int8_product(Tensor x, Tensor weight, Tensor row_sums) -> Tensor")
_operators.impl("int8_product", _int8_product, "CPU")


@torch.library.register_fake("tandem::int8_product")
def _(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
    _check_operands(x, weight, row_sums)
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def unavailable_reason() -> str | None:
    """None where the kernel runs on this machine; otherwise why `_int_mm` runs instead."""
    _loaded()
    return _reason


def _loaded() -> ctypes.CDLL | None:
    global _library, _reason, _tried
    if _tried:
        return _library
    with _lock:
        if not _tried:
            try:
                _library = _load(_built())
            except KernelUnavailable as reason:
                _reason = str(reason)
            except (OSError, subprocess.SubprocessError, AttributeError) as error:  # a read-only cache, a hung compiler, …
                _reason = f"the int8 kernel could not be built or loaded: {error!r}"
            _tried = True
    return _library


class KernelUnavailable(Exception):
    pass


def _built() -> Path:
    """The shared library for this source and these flags, compiled if the cache lacks it."""
    if not sys.platform.startswith("linux"):
        raise KernelUnavailable("the int8 kernel is built for Linux only")
    missing = NEEDED_FLAGS - cpu_flags()
    if missing:
        raise KernelUnavailable(f"this CPU lacks {', '.join(sorted(missing))}")
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise KernelUnavailable(f"no C compiler ({os.environ.get('CC', 'cc')}) to build the int8 kernel")
    try:
        source = SOURCE.read_bytes()
    except OSError as error:
        raise KernelUnavailable(f"the int8 kernel's source is missing: {error}") from error
    key = hashlib.sha256(source + " ".join(COMPILER_FLAGS).encode()).hexdigest()[:16]
    folder = paths.cache_dir() / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"int8_matmul-{key}.so"
    if library.exists():
        return library
    # Built under a temporary name and renamed: another process building at the same time
    # never loads a half-written file.
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        partial = Path(scratch) / library.name
        result = subprocess.run(
            [compiler, *COMPILER_FLAGS, "-o", str(partial), str(SOURCE), "-lm"],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=_compiler_environment(),
        )
        if result.returncode != 0:
            raise KernelUnavailable(f"building the int8 kernel failed: {result.stderr.strip()[-300:]}")
        os.replace(partial, library)
    return library


def _compiler_environment() -> dict[str, str]:
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


def _load(library: Path) -> ctypes.CDLL:
    try:
        loaded = ctypes.CDLL(str(library))
    except OSError as error:  # a corrupt cached file: build it again once
        library.unlink(missing_ok=True)
        try:
            loaded = ctypes.CDLL(str(_built()))
        except OSError:
            raise KernelUnavailable(f"the int8 kernel does not load: {error}") from error
    function = loaded.tandem_int8_product
    function.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int,
    ]
    function.restype = ctypes.c_int
    return loaded
