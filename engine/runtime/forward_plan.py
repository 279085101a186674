"""Which forward runs a torch model, decided in one place: `plan_forward` looks at the model,
the device and the pair's settings once, at load, and names the engine for each row count
(a one-token step, a verify, a prompt's piece), the precision and the int8 kernel, each with
the reason it was chosen. The runtimes only follow the plan: `torch_runtime_factory` opens
the static or the eager runtime it names, and `StaticTorchRuntime` hands each chunk of rows
to the engine the plan names for its size.

The engines, fastest first where each can run:

- native C (native_forward.py): int8 Llama-layout models on the CPU (float32; attention in bf16
  on AVX-512 BF16 CPUs), where the int8 kernel is built. Every forward, prompts included (in
  pieces of PROMPT_ROWS rows), so a verify and a step run the same arithmetic, and nothing is
  left for a compile to speed up.
- CUDA graphs (cuda_graphs.py): any model the static cache runs, on CUDA: an eager forward
  there costs 25-30 ms of launches whatever its size, a replayed graph a few ms.
- compiled torch (compiled_forward.py): on the CPU, where the pair allows a compile, the
  static forward compiled in the background; each shape runs eagerly until it is compiled.
- eager torch over the static cache: what the static runtime runs where none of those apply
  (its tests hold it against the eager runtime).
- eager torch (torch_eager.py): every other model, or where graphs and compiles are off.

What each engine can run is asked of its own module (`native_forward.refusal`,
`static_families.static_refusal`); what runs is decided here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from . import int8_kernel
from .compiled_forward import compile_allowed
from .int4_weights import Int4Linear
from .int8_weights import Int8Linear
from .native_forward import NATIVE_NAME, PROMPT_ROWS
from .native_forward import refusal as native_refusal
from .static_families import static_refusal

NATIVE = "native C"
CUDA_GRAPHS = "CUDA graphs"
COMPILED = "compiled torch"
STATIC_EAGER = "eager torch (static cache)"
EAGER = "eager torch"
# The engines that run over the static runtime's preallocated cache.
STATIC_ENGINES = {NATIVE, CUDA_GRAPHS, COMPILED, STATIC_EAGER}

# What turns CUDA graphs off for every pair, to compare them with the eager runtime.
GRAPHS_ENVIRONMENT = "TANDEM_CUDA_GRAPHS"
# The kernel builds the native forward was measured faster with than llama.cpp (docs/BENCHMARKS.md):
# AVX-512 VNNI on its own CPU, and with bf16 attention on a Zen 4; the two 256-bit builds on the
# same CPU, built as CPUs with only their features build them (TANDEM_INT8_KERNEL,
# docs/bench/native_variants.py: a step 0.50x and 0.52x of llama.cpp's time; prompts 0.87x and
# 1.23x). "auto" puts the demo pair on torch before `tandem tune` measured it only on these
# (runtime_choice.unmeasured_prefers_torch).
MEASURED_VARIANTS = {"AVX-512 BF16", "AVX-512 VNNI", "AVX-VNNI", "AVX2"}


def measured_here() -> bool:
    """Whether this CPU runs a kernel build the native forward was measured with (builds the
    kernel on a first run, ~1 s)."""
    return int8_kernel.variant_name() in MEASURED_VARIANTS


@dataclass(frozen=True)
class ForwardSettings:
    """What the caller asks of the forward; `plan_forward` decides what it gets."""

    compile: bool = False  # compile the static forward on the CPU where the model allows it
    graphs: bool | None = None  # capture CUDA graphs (None: on CUDA)
    native: bool = True  # False keeps every forward in torch (the tests of the torch path)
    static_cache: bool = False  # the static runtime even where nothing speeds it up
    precision: str = ""  # the weights' precision as loaded ("": read off the model)
    precision_reason: str = ""  # why that precision

    @classmethod
    def for_pair(cls, compile: bool, precision: str = "", precision_reason: str = "") -> ForwardSettings:
        """A loaded pair's settings, under the switches that hold for every pair:
        TANDEM_COMPILE=0 and TANDEM_CUDA_GRAPHS=0."""
        graphs = None if os.environ.get(GRAPHS_ENVIRONMENT, "1") != "0" else False
        return cls(compile=compile_allowed(compile), graphs=graphs, precision=precision, precision_reason=precision_reason)


@dataclass(frozen=True)
class RowRange:
    """The engine for forwards of up to `most_rows` rows (None: any count), and why."""

    most_rows: int | None
    engine: str
    reason: str

    def describe(self) -> str:
        rows = "every row count" if self.most_rows is None else f"up to {self.most_rows} rows"
        return f"{self.engine} for {rows} ({self.reason})"


@dataclass(frozen=True)
class ForwardPlan:
    """Which engine runs which rows of a torch model's forwards, at what precision, with which
    int8 kernel, and why; `name` is the runtime's name as the speed panel shows it."""

    name: str
    ranges: tuple[RowRange, ...]  # by row count, the last one for any count
    precision: str
    precision_reason: str
    kernel: str | None = None  # the int8 kernel build the torch products call (CPU int8 models)
    kernel_reason: str = ""

    def engine_for(self, rows: int) -> str:
        """The engine that runs a forward of `rows` rows."""
        return next(part.engine for part in self.ranges if part.most_rows is None or rows <= part.most_rows)

    @property
    def engines(self) -> set[str]:
        return {part.engine for part in self.ranges}

    @property
    def static_cache(self) -> bool:
        """Whether the static runtime runs the model (else the eager one)."""
        return bool(self.engines & STATIC_ENGINES)

    def describe(self) -> str:
        """One line for the log, the speed panel, `tandem bench` and `tandem tune`."""
        line = f"{self.name}: " + "; ".join(part.describe() for part in self.ranges)
        line += f"; precision {self.precision}" + (f" ({self.precision_reason})" if self.precision_reason else "")
        if self.kernel_reason:
            line += f"; products: {self.kernel_reason}"
        return line


def plan_forward(model: torch.nn.Module, device: torch.device, settings: ForwardSettings = ForwardSettings()) -> ForwardPlan:
    """The plan for `model` on `device` under `settings`: every choice of forward, with its reason."""
    precision = settings.precision or _precision_of(model)

    def plan(name: str, engine: str, reason: str) -> ForwardPlan:  # one engine for every row count
        kernel, kernel_reason = _int8_kernel(model, device, engine)
        return ForwardPlan(name, (RowRange(None, engine, reason),), precision, settings.precision_reason, kernel, kernel_reason)

    static_reason = static_refusal(model)
    graphs = device.type == "cuda" if settings.graphs is None else settings.graphs
    if graphs:
        if static_reason is None:
            return plan("torch + CUDA graphs", CUDA_GRAPHS, "an eager forward on CUDA costs its launches; a replayed graph a few ms")
        return plan(f"torch (no CUDA graphs: {static_reason})", EAGER, "no CUDA graphs for this model")
    native_reason = native_refusal(model, device) if settings.native else "kept in torch by its caller"
    if native_reason is None:
        build = int8_kernel.variant_name()
        measured = "measured faster than llama.cpp" if measured_here() else "never measured against llama.cpp"
        arithmetic = "attention and its KV cache in bf16" if int8_kernel.attention_in_bf16() else "float32 between the products"
        weights = _precision_of(model).removesuffix("-wo")  # int8 or int4
        return plan(NATIVE_NAME, NATIVE, f"an {weights} Llama-family model on the CPU, the {build} build ({measured}; {arithmetic}); "
                                         f"prompts in pieces of {PROMPT_ROWS} rows, so nothing is left to compile")
    not_native = f"not native: {native_reason}"
    if device.type == "cpu" and settings.compile:
        if static_reason is None:
            return plan("torch (static cache)", COMPILED, f"compiled in the background, eager until then; {not_native}")
        return plan(f"torch (not compiled: {static_reason})", EAGER, f"not compiled; {not_native}")
    if settings.static_cache:
        return plan("torch (static cache)", STATIC_EAGER, f"not compiled; {not_native}")
    if device.type == "cuda":
        return plan("torch", EAGER, "CUDA graphs are off (TANDEM_CUDA_GRAPHS=0)")
    return plan("torch", EAGER, f"not compiled (the pair's setting, or TANDEM_COMPILE=0); {not_native}")


def int8_kernel_runs_on(device: torch.device) -> bool:
    """Whether Tandem's int8 kernel runs int8 products on `device` (the CPU, where it builds)."""
    return device.type == "cpu" and int8_kernel.unavailable_reason() is None


def _precision_of(model: torch.nn.Module) -> str:
    if any(isinstance(module, Int4Linear) for module in model.modules()):
        return "int4-wo"
    if any(isinstance(module, Int8Linear) for module in model.modules()):
        return "int8-wo"
    return str(model.dtype).removeprefix("torch.")


def _int8_kernel(model: torch.nn.Module, device: torch.device, engine: str) -> tuple[str | None, str]:
    """Which build of the int8 kernel a CPU int8 model's products call, and for how many rows:
    in C every row; in torch up to the build's rows, past which oneDNN's `_int_mm` is faster
    (kernel_build.VARIANTS; `int8_kernel.integer_product` picks per call). Not asked of other
    models, since asking builds the kernel on a first run."""
    if device.type != "cpu" or not any(isinstance(module, Int8Linear) for module in model.modules()):
        return None, ""
    build = int8_kernel.variant_name()
    if build is None:
        return None, f"oneDNN's _int_mm (no kernel: {int8_kernel.unavailable_reason()})"
    if engine == NATIVE:
        return build, f"the {build} kernel, inside the C forward"
    return build, f"the {build} kernel up to {int8_kernel.most_tokens()} rows, oneDNN's _int_mm past"
