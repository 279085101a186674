"""A model folder's native forward of 1-16 tokens with int8 weights against int4 (int4_weights.py),
after 200 cached tokens: both loaded in one process, call by call, median of REPEATS each, and
the bytes of weights a step reads in each.

  TANDEM_THREADS=2 .venv/bin/python docs/bench/int4_forward.py FOLDER [TOKENS ...]
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.runtime.int4_weights import Int4Linear
from engine.runtime.int8_weights import Int8Linear
from engine.runtime.torch_load import _weights_in_memory
from engine.runtime.torch_static import StaticTorchRuntime

REPEATS = 9


def step_bytes(model: torch.nn.Module) -> int:
    """The bytes of weights and scales one step reads: every projection and the output head
    (joined layers' parts share storage: each storage counted once)."""
    storages = {}
    for module in model.modules():
        if isinstance(module, Int4Linear):
            tensors = (module.packed, module.scales)
        elif isinstance(module, Int8Linear):
            tensors = (module.weight, module.scale)
        else:
            continue
        for tensor in tensors:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def main() -> None:
    folder, tokens = Path(sys.argv[1]), [int(count) for count in sys.argv[2:]] or [1, 2, 4, 8, 16]
    print(f"kernel: {int8_kernel.variant_name()}")
    runtimes = {}
    for precision in ("int8-wo", "int4-wo"):
        model = _weights_in_memory(folder, torch.device("cpu"), precision)
        runtime = StaticTorchRuntime(model, torch.device("cpu"), 512)
        assert runtime.native is not None, runtime.name
        runtimes[precision] = runtime
        print(f"{precision}: a step reads {step_bytes(model) / 1e9:.2f} GB of weights", flush=True)
    context = list(range(1000, 1200))
    for count in tokens:
        times: dict[str, list[float]] = {name: [] for name in runtimes}
        for runtime in runtimes.values():
            time_verify(runtime, context, count)  # warm
        for _ in range(REPEATS):
            for name, runtime in runtimes.items():
                times[name].append(1000 * time_verify(runtime, context, count))
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"{count:2d} tokens: int8 {medians['int8-wo']:7.1f} ms, int4 {medians['int4-wo']:7.1f} ms "
              f"({medians['int8-wo'] / medians['int4-wo']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
