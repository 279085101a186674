"""The int8 layers' product on the CPU for a few tokens: Tandem's own kernel (`int8_matmul.c`
with AVX-512 VNNI; `int8_matmul_avx2.c` with AVX-VNNI or AVX2 alone (and FMA), for the CPUs
without AVX-512; `int8_matmul_portable.c`, plain C, for any other x86-64 CPU and as the
reference the others are tested against), built ahead of time for every variant
(kernel_build.py) and loaded for the variant this CPU runs.

Why: one token's forward is a matrix-vector product per layer. oneDNN's `torch._int_mm`
reads the weights there at about half the bandwidth two cores have (docs/BENCHMARKS.md); this
kernel reads each weight row from memory once, 2.2× faster at one token. It also rounds the activations
itself: in the compiled graph that rounding was a few small kernels per layer, each costing
about its own launch at one token.

- It gives the same floats as `torch_product`, its torch version (the same int32 sums, the
  same float32 rounding, operation for operation), so which of the two runs never changes a
  logit, and a token's row stays the same in any batch.
- Past a number of rows that depends on the variant (long verifies, prompt chunks) oneDNN's
  blocked GEMM is faster, and `torch_product` takes over; in a compiled graph the kernel runs
  one-token forwards only (`integer_product` says why).
- Where the kernel cannot run (not Linux on x86-64, no library and no C compiler, a failed
  build, a library whose structs differ from kernel_abi.py's), `torch_product` does the work;
  `unavailable_reason()` says why.
- The product is a torch operator, so torch.compile keeps it as one opaque call in the graph.
- The library comes from engine/runtime/_built/ (packaging/setup.sh, the wheel, the bundle);
  where that holds none for these sources (a checkout without setup, or pulled since), it is
  compiled on first use by the machine's C compiler and cached per source and flags under
  Tandem's cache folder (about a second, once). `library_origin()` says which.
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

from .. import paths
from .cpu import cpu_flags, forward_threads
from .kernel_abi import mismatch
# The variant table lives with the build step; benches and tests read it here too.
from .kernel_build import DECODER_SOURCE, INT4_SOURCE, PREBUILT_DIR, VARIANTS, BuildFailed, Variant, compile_library, library_name

# A narrower build than this CPU's ("AVX2", "portable", …), or "off" (chosen_variant)
KERNEL_VARIABLE = "TANDEM_INT8_KERNEL"
# Whether a compiled one-token forward calls the kernel. Read while tracing, so dynamo keeps a
# graph per value: docs/bench/int8_kernel_step.py compiles both and times them call by call.
KERNEL_IN_ONE_TOKEN_GRAPHS = True

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_reason: str | None = None  # why the kernel is not used; None until the first attempt
_variant: Variant | None = None  # the variant loaded
_origin: str | None = None  # where the loaded library came from (library_origin)
_tried = False
log = logging.getLogger("tandem.int8_kernel")


def integer_product(x: torch.Tensor, weight: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
    """x @ weight.T in float32 for float rows x (m, k) and an int8 weight (n, k) whose rows sum
    to `row_sums` (int32, `weight_row_sums`), by an integer matmul with int32 sums.

    Each row is rounded to int8 twice: once at its own scale (max |x| / 127), then what that
    left over at the leftover's scale. One level alone costs a 135M model a tenth of its
    top-1 agreement with its float self (outlier channels flatten the rest of the row); two
    levels measure the same as the float activations (docs/BENCHMARKS.md). The sums are exact
    and each row is rounded on its own, so a row's product never depends on the rows batched
    with it: a verify of k tokens gives each token the logits a one-token step gives it.

    Which runs it: the kernel for up to its variant's `most_tokens` rows. Inside a compiled
    graph only for one row: there inductor fuses torch_product's rounding into the kernels
    around it, and with `_int_mm` that was no slower than the kernel for a verify of several
    tokens (docs/BENCHMARKS.md). The row count is a constant of the one-token graph, so the
    choice adds no graph."""
    x = x.float()
    if torch.compiler.is_compiling():  # torch_static loads the kernel before it compiles
        use_kernel = x.shape[0] == 1 and KERNEL_IN_ONE_TOKEN_GRAPHS and _library is not None and _variant.in_compiled_graphs
    else:
        use_kernel = _loaded() is not None and x.shape[0] <= _variant.most_tokens
    return torch.ops.tandem.int8_product.default(x, weight, row_sums) if use_kernel else torch_product(x, weight)


def weight_row_sums(weight: torch.Tensor) -> torch.Tensor:
    """What the kernel needs kept with an int8 weight: each row's sum, as int32."""
    return weight.sum(dim=1, dtype=torch.int32)


def torch_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """integer_product in torch: both levels through one `torch._int_mm` as 2n rows. The
    kernel rounds as this does, operation for operation, and gives the same floats."""
    # times the scale's reciprocal rather than divided by it: the kernel's divisions had been a
    # third of its rounding time
    first_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    first = torch.round(x * (1.0 / first_scale))
    leftover = x - first * first_scale
    second_scale = leftover.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    second = torch.round(leftover * (1.0 / second_scale))
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
        forward_threads(),
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


def variant_name() -> str | None:
    """Which build of the kernel runs here ("AVX-512 BF16", "AVX-512 VNNI", "AVX-VNNI", "AVX2", "portable"), or None."""
    return _variant.name if _loaded() is not None else None


def attention_in_bf16() -> bool:
    """Whether the build that runs here multiplies the native forward's attention in bf16 (and
    keeps its KV cache in bf16), as the library itself says."""
    library = _loaded()
    return library is not None and library.tandem_cache_element_bytes() == 2


def attention_range_rows() -> int | None:
    """The key rows of one of the native forward's attention ranges (decoder_forward.c,
    RANGE_ROWS), or None without the library."""
    library = _loaded()
    return None if library is None else int(library.tandem_attention_range_rows())


def key_block_rows() -> int:
    """The rows of a block of the native forward's key cache, as the library itself says: 1
    where it keeps keys in rows, as torch does (key_blocks.py)."""
    library = _loaded()
    return 1 if library is None else int(library.tandem_key_block_rows())


def use_amx(on: bool | None = None) -> bool:
    """Whether AMX's tiles run the products of 2 or more tokens (int8_matmul.c says how; the
    floats are the vector path's to the bit), after turning it on or off (None: only asks).
    False where the build, the CPU or the operating system has none (most desktops)."""
    library = _loaded()
    switch = getattr(library, "tandem_int8_use_amx", None) if library is not None else None
    return bool(switch(-1 if on is None else int(on))) if switch is not None else False


def unavailable_reason() -> str | None:
    """None where the kernel runs on this machine; otherwise why `_int_mm` runs instead."""
    _loaded()
    return _reason


def library_origin() -> str | None:
    """Where the loaded library came from: prebuilt (its path) or compiled here at first use
    (the compiler and the cached path); None where the kernel does not run."""
    _loaded()
    return _origin if _library is not None else None


def _loaded() -> ctypes.CDLL | None:
    global _library, _reason, _tried, _variant
    if _tried:
        return _library
    with _lock:
        if not _tried:
            try:
                _variant = chosen_variant()
                _library = _load(_variant)
                log.info("int8 kernel %s: %s", _variant.name, _origin)
            except KernelUnavailable as reason:
                _reason = str(reason)
            except (OSError, subprocess.SubprocessError, AttributeError) as error:  # a read-only cache, …
                _reason = f"the int8 kernel could not be built or loaded: {error!r}"
            if _reason is not None:
                log.info("int8 kernel not used: %s", _reason)
            _tried = True
    return _library


class KernelUnavailable(Exception):
    pass


def _built(variant: Variant) -> Path:
    """`variant`'s library compiled here into the cache, where no prebuilt one fits: a checkout
    that setup has not built, or whose sources changed since."""
    global _origin
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise KernelUnavailable(f"no prebuilt int8 kernel for these sources in {PREBUILT_DIR} "
                                f"(packaging/setup.sh builds them), and no C compiler ({os.environ.get('CC', 'cc')}) to build it")
    library = paths.cache_dir() / "kernels" / _library_name(variant)
    _origin = f"compiled at first use by {compiler} into {library} (no prebuilt library for these sources in {PREBUILT_DIR})"
    if not library.exists():
        try:
            compile_library(variant, library, warnings=())
        except BuildFailed as error:
            raise KernelUnavailable(str(error)) from error
    return library


def _library_name(variant: Variant) -> str:
    try:
        return library_name(variant)
    except OSError as error:
        raise KernelUnavailable(f"the int8 kernel's source is missing: {error}") from error


def chosen_variant() -> Variant:
    """The build for this CPU, or the narrower one TANDEM_INT8_KERNEL names ("AVX2",
    "AVX-VNNI", "portable"): what a CPU with only those features runs, measured on this one
    (docs/bench/native_variants.py, `tandem bench`). TANDEM_INT8_KERNEL=off leaves the products
    to torch."""
    wanted = os.environ.get(KERNEL_VARIABLE, "").strip()
    if not wanted:
        return variant_for(cpu_flags())
    if wanted.lower() == "off":
        raise KernelUnavailable(f"the int8 kernel is turned off ({KERNEL_VARIABLE}=off)")
    named = next((variant for variant in VARIANTS if variant.name.lower() == wanted.lower()), None)
    if named is None:
        choices = ", ".join(variant.name for variant in VARIANTS)
        raise KernelUnavailable(f"{KERNEL_VARIABLE}={wanted!r} names no build of the int8 kernel (one of {choices}, or off)")
    if not named.needs <= cpu_flags():
        raise KernelUnavailable(f"{KERNEL_VARIABLE}={named.name!r}: this CPU lacks {', '.join(sorted(named.needs - cpu_flags()))}")
    return named


def variant_for(flags: frozenset[str]) -> Variant:
    """The build for a CPU with these feature flags: the first in VARIANTS it has every feature
    of, the portable build where it has none of the others' (KernelUnavailable where none fits)."""
    for variant in VARIANTS:
        if variant.needs <= flags:
            return variant
    raise KernelUnavailable("no build of the int8 kernel fits this CPU")


def _load(variant: Variant) -> ctypes.CDLL:
    """`variant`'s library: the prebuilt one, else one compiled here (again where a cached one
    does not load: a half-written or corrupt file)."""
    global _origin
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        raise KernelUnavailable("the int8 kernel is built for Linux on x86-64 only")
    prebuilt = PREBUILT_DIR / _library_name(variant)
    if prebuilt.exists():
        try:
            loaded = ctypes.CDLL(str(prebuilt))
            _origin = f"prebuilt, {prebuilt}"
            return _declared(loaded)
        except OSError as error:  # another machine's file: this one's compiler may still build it
            log.warning("the prebuilt int8 kernel %s does not load (%s); building it here", prebuilt, error)
    library = _built(variant)
    try:
        loaded = ctypes.CDLL(str(library))
    except OSError as error:
        library.unlink(missing_ok=True)
        try:
            loaded = ctypes.CDLL(str(_built(variant)))
        except OSError:
            raise KernelUnavailable(f"the int8 kernel does not load: {error}") from error
    return _declared(loaded)


def build_for_comparison(variant: Variant, out: Path, sources: tuple[Path, ...] | None = None) -> ctypes.CDLL:
    """A library built from `sources` (the variant's and the decoder's by default) with the
    variant's flags at `out`, loaded beside the runtime's own: for benchmarks that switch
    between builds call by call (docs/bench/native_forward_ab.py, native_variants.py)."""
    compile_library(variant, out, warnings=(), sources=sources)
    return _declared(ctypes.CDLL(str(out)))


def _declared(loaded: ctypes.CDLL) -> ctypes.CDLL:
    """`loaded` with its functions' argument and result types set, once its ABI (version,
    struct sizes, field offsets) is this Tandem's (KernelUnavailable, saying what differs,
    where it is not)."""
    refusal = mismatch(loaded)
    if refusal is not None:
        raise KernelUnavailable(refusal)
    function = loaded.tandem_int8_product
    function.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int,
    ]
    function.restype = ctypes.c_int
    int4 = loaded.tandem_int4_linear
    int4.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
    ]
    int4.restype = ctypes.c_int
    forward = loaded.tandem_decoder_forward
    forward.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_int,
    ]
    forward.restype = ctypes.c_int
    spans = loaded.tandem_decoder_forward_spans
    spans.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
    ]
    spans.restype = ctypes.c_int
    loaded.tandem_cache_element_bytes.argtypes = []
    loaded.tandem_cache_element_bytes.restype = ctypes.c_int64
    loaded.tandem_key_block_rows.argtypes = []
    loaded.tandem_key_block_rows.restype = ctypes.c_int64
    loaded.tandem_attention_range_rows.argtypes = []
    loaded.tandem_attention_range_rows.restype = ctypes.c_int64
    head = loaded.tandem_eagle3_forward
    head.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int,
    ]
    head.restype = ctypes.c_int
    if hasattr(loaded, "tandem_int8_use_amx"):  # the AVX-512 VNNI build only
        loaded.tandem_int8_use_amx.argtypes = [ctypes.c_int]
        loaded.tandem_int8_use_amx.restype = ctypes.c_int
    loaded.tandem_exp.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    loaded.tandem_exp.restype = None
    return loaded


def loaded_library() -> ctypes.CDLL | None:
    """The built library (the product and the decoder forward), or None where it cannot run."""
    return _loaded()


def most_tokens() -> int:
    """The most rows the kernel takes before torch's product is faster (0 where it cannot run)."""
    return _variant.most_tokens if _loaded() is not None else 0
