"""Which runtime and precision run a pair whose settings say "auto", as measured here.

Without a measurement, "auto" is llama.cpp wherever the target has a GGUF file, at the
runtime's own 8-bit default, except for the bundled demo target on a CPU where torch's
native int8 forward was measured faster (`unmeasured_prefers_torch`). But what is fastest
depends on the machine and the method: speculation pays only where a verify of many tokens
costs about one step, and which runtime that is depends on the machine: on a GPU, the
CUDA-graph torch runtime verifies 64 tokens for 1.3x a step while llama.cpp on the CPU pays
2.6x for 8. `tandem tune` (an offline tool) measures each runtime's
costs for the pair on this machine, predicts each one's fastest method from them, measures
that method there, and writes the winner here; a pair loaded with "auto" runtime and "auto"
target precision then uses it.

The choice places the target; the draft follows it where it can run there (torch runs any
model, llama.cpp needs the draft's GGUF file) and is otherwise placed as "auto" places it.
A choice is kept per pair (its models, not the settings that it chooses) and per machine
(processor, threads, GPU, library versions, whether torch may compile): another machine, or
an upgraded torch, measures again. It is a cache: a file that cannot be read counts as no
choice, and one whose runtime no longer loads the pair is dropped (session.load_pair).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .config import DEMO_TARGET, ModelSpec, PairConfig
from .models import runtime_gguf
from .paths import cache_dir
from .runtime.compiled_forward import compile_allowed
from .runtime.cpu import chosen_threads, cpu_name
from .runtime.device import device_name, resolve_device
from .runtime.forward_plan import measured_here

FOLDER = "runtime-choice"


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # "torch" or "llama.cpp"
    precision: str  # the target's precision on it ("auto": that runtime's own default)
    method: str  # the method that was fastest with it
    tokens_per_s: float  # that method's throughput, re-priced with this runtime's costs
    measured_on: str  # the date of the measurement
    candidates: dict[str, float] = field(default_factory=dict)  # every candidate's best tokens/s

    @property
    def label(self) -> str:
        return runtime_label(self.runtime, self.precision)

    def describe(self) -> str:
        """One line for the pair's About and status: what was chosen, and over what."""
        others = ", ".join(f"{name} {speed:.0f}" for name, speed in self.candidates.items() if name != self.label)
        against = f" (against {others} tok/s)" if others else ""
        return f"{self.label}, chosen by tandem tune on {self.measured_on}: {self.method} {self.tokens_per_s:.0f} tok/s{against}"

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "precision": self.precision, "method": self.method,
                "tokens_per_s": self.tokens_per_s, "measured_on": self.measured_on, "candidates": self.candidates}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeChoice:
        return cls(str(data["runtime"]), str(data["precision"]), str(data["method"]), float(data["tokens_per_s"]),
                   str(data["measured_on"]), {str(name): float(speed) for name, speed in data.get("candidates", {}).items()})


def runtime_label(runtime: str, precision: str) -> str:
    return runtime if precision == "auto" else f"{runtime} {precision}"


def applies_to(config: PairConfig) -> bool:
    """Whether a measured choice may decide for `config`: only what the user left to "auto"."""
    return config.runtime == "auto" and config.target.precision == "auto"


@dataclass(frozen=True)
class Placement:
    """Where a pair's models load: the target (with its precision) and the draft's runtime."""

    target: ModelSpec
    target_runtime: str
    draft_runtime: str


def placement(config: PairConfig, choice: RuntimeChoice | None, measured_defaults: bool = True) -> Placement:
    """`config`'s models as its own settings place them (and, with `measured_defaults`, as
    `unmeasured_prefers_torch` places the demo pair), or with the target on `choice`'s
    runtime and precision and the draft following it where the draft can run there."""
    if choice is None:
        if measured_defaults and unmeasured_prefers_torch(config):
            return Placement(config.target, "torch", "torch")
        return Placement(config.target, config.runtime, config.runtime)
    draft_follows = config.draft is None or choice.runtime == "torch" or runtime_gguf(config.draft, "auto") is not None
    return Placement(replace(config.target, precision=choice.precision), choice.runtime,
                     choice.runtime if draft_follows else config.runtime)


def unmeasured_prefers_torch(config: PairConfig) -> bool:
    """Whether "auto" loads the pair on torch before `tandem tune` measured it here: the bundled
    demo target on a CPU where torch runs it with the native int8 forward's measured build
    (forward_plan.MEASURED_VARIANTS; 1.77x llama.cpp's plain decoding on the development CPU,
    docs/BENCHMARKS.md). Not any other GGUF target: its torch copy is converted through
    float32 weights (28 GB for a 7B model), which llama.cpp never needs."""
    if not applies_to(config) or config.target.source != DEMO_TARGET or resolve_device(config.target.device).type != "cpu":
        return False
    return measured_here()  # builds the int8 kernel on a first run (~1 s)


def load_choice(config: PairConfig) -> RuntimeChoice | None:
    """The choice measured for `config` on this machine, or None (never measured, or unreadable)."""
    try:
        return RuntimeChoice.from_dict(json.loads(choice_path(config).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def forget_choice(config: PairConfig) -> None:
    choice_path(config).unlink(missing_ok=True)


def save_choice(config: PairConfig, choice: RuntimeChoice) -> Path:
    path = choice_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(choice.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def choice_path(config: PairConfig) -> Path:
    digest = hashlib.sha256(f"{_pair_key(config)}|{_machine_key(config)}".encode()).hexdigest()[:16]
    return cache_dir() / FOLDER / f"{digest}.json"


def _pair_key(config: PairConfig) -> str:
    """The pair's models: not its runtime or its target's precision, which are what the
    choice decides, nor its name or compile setting (the machine key has the latter)."""
    described = config.to_dict()
    described.pop("runtime", None)
    described.pop("compile", None)
    described.pop("name", None)
    if isinstance(described.get("target"), dict):
        described["target"] = {key: value for key, value in described["target"].items() if key != "precision"}
    return json.dumps(described, sort_keys=True)


def _machine_key(config: PairConfig) -> str:
    gpu = device_name(resolve_device(config.target.device)) or "no gpu"
    # Whether torch compiles decides its speed on a CPU (1.6x): a choice measured compiled
    # does not hold for a pair, or a process, that does not compile.
    return "|".join((cpu_name(), str(os.cpu_count()), str(chosen_threads() or ""), gpu,
                     _version("torch"), _version("llama-cpp-python"), f"compile={compile_allowed(config.compile)}"))


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"
