"""Two builds of the native kernels over one loaded model folder, call by call in one process:
the C sources (and headers) of a git revision BEFORE against the working tree's.

Where docs/bench/native_forward_ab.py times the demo target, this takes any Hugging Face folder
(the weight-random shapes of docs/bench/random_shape.py) at a precision (`PRECISION`, default
int4-wo). Both libraries are built with the runtime's flags, and the forward switches between
them call by call, in turn first: a verify of k tokens after 200 cached tokens, median of
REPEATS each. It also says whether the two builds gave the same logits, to the bit.

  PRECISION=int4-wo TANDEM_THREADS=2 .venv/bin/python docs/bench/kernel_ab.py BEFORE FOLDER 1,2,4,8 [REPEATS]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.runtime.torch_load import _weights_in_memory
from engine.runtime.torch_static import StaticTorchRuntime

CONTEXT = [1000 + (i * 7) % 5000 for i in range(200)]


def source_at(revision: str, path: Path) -> bytes:
    tracked = path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    return subprocess.run(["git", "show", f"{revision}:{tracked}"], capture_output=True, check=True).stdout


def builds(before: str, folder: Path) -> dict:
    """{"before": library, "after": library} for the variant this CPU runs."""
    variant = int8_kernel.chosen_variant()
    for header in Path("engine/runtime").glob("*.h"):
        (folder / header.name).write_bytes(source_at(before, header))
    old_sources = []
    for source in (variant.source, int8_kernel.DECODER_SOURCE, int8_kernel.INT4_SOURCE):
        (folder / source.name).write_bytes(source_at(before, source))
        old_sources.append(folder / source.name)
    return {"before": int8_kernel.build_for_comparison(variant, folder / "before.so", tuple(old_sources)),
            "after": int8_kernel.build_for_comparison(variant, folder / "after.so")}


def main() -> None:
    before, folder, counts = sys.argv[1], Path(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")]
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 11
    model = _weights_in_memory(folder, torch.device("cpu"), os.environ.get("PRECISION", "int4-wo"))
    target = StaticTorchRuntime(model, torch.device("cpu"), 512)
    with tempfile.TemporaryDirectory() as scratch:
        libraries = builds(before, Path(scratch))
        for count in counts:
            logits = {}
            for name, library in libraries.items():
                target.native.library = library
                target.catch_up(CONTEXT)
                logits[name] = target.logits_for(CONTEXT, [CONTEXT[-1]] * (count - 1)).clone()
                target.crop(len(CONTEXT) - 1)
            times: dict[str, list[float]] = {name: [] for name in libraries}
            for repeat in range(repeats):
                order = list(libraries.items())
                for name, library in order if repeat % 2 == 0 else order[::-1]:
                    target.native.library = library
                    times[name].append(1000 * time_verify(target, CONTEXT, count))
            median = {name: statistics.median(values) for name, values in times.items()}
            print(f"{count:2d} tokens: before {median['before']:6.1f} ms, after {median['after']:6.1f} ms "
                  f"(after/before {median['after'] / median['before']:.3f}); same logits: "
                  f"{torch.equal(logits['before'], logits['after'])}", flush=True)


if __name__ == "__main__":
    main()
