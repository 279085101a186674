"""A model folder's native forward of 1-16 tokens with int8 weights against int4 (int4_weights.py),
after 200 cached tokens: both loaded in one process, call by call, median of REPEATS each, and
the bytes of weights a step reads in each. Then generation as llama-bench times it (`tg`): after
an 8-token prompt, GENERATED greedy steps of one token each, prompt not counted.

  TANDEM_THREADS=2 .venv/bin/python docs/bench/int4_forward.py FOLDER [TOKENS ...]
  PRECISIONS=int4-wo .venv/bin/python docs/bench/int4_forward.py FOLDER 0    # generation only
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.runtime.int4_weights import Int4Linear
from engine.runtime.int8_weights import Int8Linear
from engine.runtime.torch_load import _weights_in_memory
from engine.runtime.torch_static import StaticTorchRuntime

REPEATS = 9
GENERATED = 32


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


def generation_rate(runtime: StaticTorchRuntime) -> float:
    """Tokens per second of GENERATED greedy one-token steps after an 8-token prompt."""
    runtime.crop(0)
    logits = runtime.forward(list(range(1000, 1008)))
    started = time.perf_counter()
    for _ in range(GENERATED):
        logits = runtime.forward([int(logits[-1].argmax())])
    return GENERATED / (time.perf_counter() - started)


def main() -> None:
    folder, tokens = Path(sys.argv[1]), [int(count) for count in sys.argv[2:] if int(count) > 0]
    if len(sys.argv) == 2:
        tokens = [1, 2, 4, 8, 16]
    print(f"kernel: {int8_kernel.variant_name()}")
    runtimes = {}
    for precision in os.environ.get("PRECISIONS", "int8-wo,int4-wo").split(","):
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
        print(f"{count:2d} tokens: " + ", ".join(f"{name} {value:7.1f} ms" for name, value in medians.items()), flush=True)
    for name, runtime in runtimes.items():
        rates = [generation_rate(runtime) for _ in range(3)]
        print(f"{name} generation ({GENERATED} tokens after 8): " + ", ".join(f"{rate:.1f}" for rate in rates) + " tok/s",
              flush=True)


if __name__ == "__main__":
    main()
