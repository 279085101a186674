"""The compiled torch step of the int8 demo target with and without Tandem's int8 kernel, in
one process, call by call (issue 21).

Two separate bench runs of the compiled runtime drift by more than the kernel's gain on this
VM (its memory speed changes from minute to minute), so this compiles the one-token forward
twice, once calling the kernel and once with torch's rounding and `_int_mm` fused by inductor
(int8_kernel.KERNEL_IN_ONE_TOKEN_GRAPHS; dynamo keeps a graph per value and picks one by its
guard), and alternates them: a step after 200 cached tokens, median of 101 each. An 8-token
verify (the same graph either way) is timed alongside as a yardstick.

  .venv/bin/python docs/bench/int8_kernel_step.py
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

from engine.pairs import find_pair
from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.session import load_pair

REPEATS = 101


def main() -> None:
    print(f"int8 kernel: {int8_kernel.unavailable_reason() or 'built and used'}")
    pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: print(f"  {message}", file=sys.stderr))
    pair.wait_for_background_work()  # compiled with the kernel in the one-token graphs
    target = pair.target_runner
    print(f"runtime: {pair.runtime_label}")
    # The same shapes again, with the switch off: only the one-token graphs read it, so only
    # they are compiled a second time.
    int8_kernel.KERNEL_IN_ONE_TOKEN_GRAPHS = False
    with torch.inference_mode():
        buffers = tuple(torch.zeros_like(buffer) for buffer in (target.ids, target.positions, target.rows, target.visible))
    target.compiler._compile(target.forward_pass, buffers)
    context = list(range(1000, 1200))
    times: dict[str, list[float]] = {"kernel": [], "torch": [], "verify 8": []}
    for switch in (True, False, True, False):  # warm both graphs
        int8_kernel.KERNEL_IN_ONE_TOKEN_GRAPHS = switch
        time_verify(target, context, 1)
    for _ in range(REPEATS):
        for name, switch in (("kernel", True), ("torch", False)):
            int8_kernel.KERNEL_IN_ONE_TOKEN_GRAPHS = switch
            times[name].append(1000 * time_verify(target, context, 1))
        times["verify 8"].append(1000 * time_verify(target, context, 8))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"step: kernel {medians['kernel']:.2f} ms, torch {medians['torch']:.2f} ms "
          f"({medians['torch'] / medians['kernel']:.2f}×); verify of 8: {medians['verify 8']:.2f} ms "
          f"({medians['verify 8'] / medians['kernel']:.2f}× the kernel's step, {medians['verify 8'] / medians['torch']:.2f}× torch's)")


if __name__ == "__main__":
    main()
