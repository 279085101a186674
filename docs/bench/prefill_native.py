"""Reading long prompts with the native forward: two builds of its C sources over the same
loaded demo target, prompt by prompt in one process (issue 45, item 5).

The C sources of a git revision (BEFORE) and the working tree's are built here with the
runtime's flags, and the runtime's forward switches between them read by read, so the host's
drift (other work on the 2 cores) moves both alike. Each prompt of N tokens is read from an
empty cache the way the app reads one (in pieces of PROMPT_ROWS, only the last row's logits
wanted); prints each build's median seconds and tokens per second over REPEATS reads.

  .venv/bin/python docs/bench/prefill_native.py BEFORE [TOKENS ...]
  .venv/bin/python docs/bench/prefill_native.py - [TOKENS ...]   # the working tree's build alone
  .venv/bin/python docs/bench/prefill_native.py "build:AVX-512 VNNI" [TOKENS ...]

The third form compares another build of the working tree's sources (a variant name, as
TANDEM_INT8_KERNEL takes it) with the one this CPU chooses, each over its own loaded target:
builds whose caches differ (the bf16 attention build keeps bf16 keys and values) cannot share
one runtime.

STEPS=N also times N one-token steps after each read (a reply's tokens at that context), and
prints each build's median milliseconds a step.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from engine.pairs import find_pair
from engine.runtime import int8_kernel
from engine.runtime.native_forward import PROMPT_ROWS
from engine.session import load_pair

REPEATS = int(os.environ.get("REPEATS", "2"))
STEPS = int(os.environ.get("STEPS", "0"))


def prompt_of(count: int) -> list[int]:
    return [1000 + (i * 7) % 5000 for i in range(count)]


def load_target(build: str | None):
    """The demo pair with no draft, its target on `build` of the kernel (None: the build
    TANDEM_INT8_KERNEL names, else this CPU's). The kernel is loaded afresh for it."""
    for name, fresh in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
        setattr(int8_kernel, name, fresh)
    said = os.environ.get("TANDEM_INT8_KERNEL")
    if build is not None:
        os.environ["TANDEM_INT8_KERNEL"] = build
    try:
        return load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)
    finally:
        if said is None:
            os.environ.pop("TANDEM_INT8_KERNEL", None)
        else:
            os.environ["TANDEM_INT8_KERNEL"] = said


def read(target, prompt: list[int]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of reading `prompt` from an empty cache (with
    TANDEM_THREADS=1, the CPU seconds are the work alone, whatever else the cores run)."""
    target.reset()
    started, cpu = time.perf_counter(), time.process_time()
    target.forward(prompt, logits_wanted=1)
    return time.perf_counter() - started, time.process_time() - cpu


def step_times(target) -> list[float]:
    """Seconds of each of STEPS one-token steps after a read."""
    taken = []
    for token in prompt_of(STEPS):
        started = time.perf_counter()
        target.forward([token], logits_wanted=1)
        taken.append(time.perf_counter() - started)
    return taken


def measure(contenders: dict[str, Callable[[], object]], counts: list[int]) -> None:
    """Each contender (a name, and what readies its target and returns it) read by read, their
    order turned every repeat; prints each one's medians."""
    for count in counts:
        prompt = prompt_of(count)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        steps: dict[str, list[float]] = {name: [] for name in contenders}
        for repeat in range(REPEATS):
            order = list(contenders.items()) if repeat % 2 == 0 else list(contenders.items())[::-1]
            for name, ready in order:
                target = ready()
                wall, used = read(target, prompt)
                times[name].append(wall)
                cpu[name].append(used)
                steps[name] += step_times(target)
        print(f"{count:5d} tokens: " + ", ".join(
            f"{name} {statistics.median(values):6.2f} s ({count / statistics.median(values):4.0f} tok/s; "
            f"runs {' '.join(f'{value:.2f}' for value in values)}; CPU {statistics.median(cpu[name]):.2f} s)"
            for name, values in times.items()), flush=True)
        if STEPS:
            print(f"{count:5d} tokens, then a step: " + ", ".join(
                f"{name} {1000 * statistics.median(values):.2f} ms" for name, values in steps.items()), flush=True)


def compare_builds(build: str, counts: list[int]) -> None:
    """`build` against this CPU's choice, each over its own target."""
    other = load_target(build)
    chosen = load_target(None)
    measure({build: lambda: other.target_runner, int8_kernel.variant_name(): lambda: chosen.target_runner}, counts)
    other.close()
    chosen.close()


def compare_revisions(before: str, counts: list[int]) -> None:
    """The C sources of revision `before` (or none: "-") and the working tree's, built with this
    CPU's flags, switched under one loaded target."""
    pair = load_target(None)
    target = pair.target_runner
    print(f"runtime: {target.name}, kernel: {int8_kernel.variant_name()}, pieces of {PROMPT_ROWS}", flush=True)
    variant = int8_kernel.chosen_variant()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        libraries = {}
        if before != "-":
            old_sources = []
            headers = [int8_kernel.DECODER_SOURCE.with_name(name) for name in ("simd.h", "tandem_abi.h")]
            for source in (variant.source, int8_kernel.DECODER_SOURCE, *headers):
                path = folder / source.name
                tracked = source.resolve().relative_to(Path.cwd().resolve()).as_posix()  # run from the repository's root
                path.write_bytes(subprocess.run(["git", "show", f"{before}:{tracked}"], capture_output=True, check=True).stdout)
                old_sources.append(path)
            libraries["before"] = int8_kernel.build_for_comparison(variant, folder / "before.so", tuple(old_sources[:2]))
        libraries["after"] = int8_kernel.build_for_comparison(variant, folder / "after.so")

        def with_library(library):
            def ready():
                target.native.library = library
                return target
            return ready

        measure({name: with_library(library) for name, library in libraries.items()}, counts)
    pair.close()


def main() -> None:
    before, counts = sys.argv[1], [int(count) for count in sys.argv[2:]] or [500, 2000, 4000, 7000]
    if before.startswith("build:"):
        compare_builds(before.removeprefix("build:"), counts)
    else:
        compare_revisions(before, counts)


if __name__ == "__main__":
    main()
