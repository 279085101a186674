"""The demo target's int8 static forward on the CPU, uncompiled, with q/k/v and gate/up joined
into one integer matmul each (what it runs) and with every projection on its own (issue 21).

A forward over 1, 2, 4, 8 and 16 new tokens after a 200-token context, the two variants
interleaved, median of 15 each; both runtimes share the model's weights. The compiled forward
is timed by `tandem bench` / `tandem tune` instead (its compile takes minutes).

  TANDEM_COMPILE=0 .venv/bin/python docs/bench/joined_projections.py
"""
from __future__ import annotations

import statistics

import torch

from engine.config import DEMO_TARGET, ModelSpec
from engine.models import load_model
from engine.round import time_verify
from engine.runtime.joined_projections import JoinedProjections
from engine.runtime.torch_static import StaticTorchRuntime

SIZES = (1, 2, 4, 8, 16)
REPEATS = 15


def main() -> None:
    torch.set_num_threads(2)
    target = load_model(ModelSpec(DEMO_TARGET, precision="int8-wo", device="cpu"), runtime="torch")
    model = target.model
    joined = StaticTorchRuntime(model, torch.device("cpu"), 1024, graphs=False)
    separate = StaticTorchRuntime(model, torch.device("cpu"), 1024, graphs=False)
    separate.forward_pass.joined = [JoinedProjections()] * len(model.model.layers)
    context = [(token * 7919) % 40000 + 100 for token in range(200)]
    print("tokens   joined ms   separate ms   separate / joined")
    for size in SIZES:
        timings: dict[str, list[float]] = {"joined": [], "separate": []}
        for runtime in (joined, separate):
            time_verify(runtime, context, size)  # warm-up
        for _ in range(REPEATS):
            for name, runtime in (("joined", joined), ("separate", separate)):
                timings[name].append(1000 * time_verify(runtime, context, size))
        a, b = statistics.median(timings["joined"]), statistics.median(timings["separate"])
        print(f"{size:6d}   {a:9.1f}   {b:11.1f}   {b / a:17.2f}")


if __name__ == "__main__":
    main()
