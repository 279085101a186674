"""Probe for issue 21: one static-cache forward of the demo target on the CPU (torch runtime,
engine/runtime/static_cache_forward.py), eager or under torch.compile, for 1 and 8 tokens over a
256-row key window. Medians of 20 calls after 4 warm-up calls; the first call's time is the
compile. Not part of the app: a measurement, run from the repository root:

    .venv/bin/python docs/bench/compile_probe.py bf16 compile
    .venv/bin/python docs/bench/compile_probe.py int8-wo compile --packed-int8

--packed-int8 swaps Int8Linear's forward (a bf16 copy of the weight, then a matmul) for
torch._weight_int8pack_mm, the fused int8 weight-only kernel, for this run only.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from engine.config import DEMO_TARGET, ModelSpec
from engine.models import load_model
from engine.runtime import int8_weights
from engine.runtime.static_cache_forward import StaticCacheForward

WINDOW = 256


def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not hasattr(self, "_bf16_scale"):
        self._bf16_scale = self.scale.reshape(-1).to(torch.bfloat16)
    shape = x.shape
    out = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight, self._bf16_scale)
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*shape[:-1], -1).to(x.dtype)


def inputs(count: int) -> tuple[torch.Tensor, ...]:
    """`count` tokens after 100 cached ones (cache rows 64..163), each seeing those and itself."""
    ids = torch.randint(0, 1000, (count,))
    positions = torch.arange(100, 100 + count)
    rows = torch.arange(164, 164 + count)
    visible = torch.zeros(count, WINDOW, dtype=torch.bool)
    visible[:, 64:164] = True
    visible[torch.arange(count), rows] = True
    return ids, positions, rows, visible


def main(precision: str, mode: str, packed: bool) -> None:
    torch.set_num_threads(2)
    if packed:
        int8_weights.Int8Linear.forward = packed_forward
    model = load_model(ModelSpec(DEMO_TARGET, precision=precision, device="cpu"), runtime="torch").model
    forward = StaticCacheForward(model, 64 + 512, torch.device("cpu"))
    call = torch.compile(forward, dynamic=False) if mode == "compile" else forward
    medians = {}
    for count in (1, 8):
        arguments = inputs(count)
        with torch.inference_mode():
            started = time.perf_counter()
            call(*arguments)
            first = time.perf_counter() - started
            for _ in range(3):
                call(*arguments)
            times = []
            for _ in range(20):
                started = time.perf_counter()
                call(*arguments)
                times.append(time.perf_counter() - started)
        medians[count] = statistics.median(times) * 1000
        print(f"{precision}{' packed' if packed else ''} {mode} n={count}: first call {first:.1f} s, median {medians[count]:.1f} ms")
    print(f"verify(8) / step = {medians[8] / medians[1]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--packed-int8" in sys.argv[3:])
