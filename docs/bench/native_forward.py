"""The int8 demo target's forward of 1-16 tokens: the native forward (one C call) against the
same static runtime compiled by torch.compile (the fastest torch path before it), in one
process, call by call (issue 21).

Both runtimes share the loaded int8 model. The compiled one is built as the runtime builds it
for a model the native forward cannot run (a background compile of every token bucket, with
Tandem's int8 kernel in its one-token graphs); this waits for that compile (minutes the first
time, then inductor's disk cache), then alternates the two: a forward of k tokens after 200
cached tokens, median of REPEATS each.

  .venv/bin/python docs/bench/native_forward.py
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from engine.pairs import find_pair
from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.runtime.torch_static import StaticTorchRuntime
from engine.session import load_pair

REPEATS = 31
TOKENS = (1, 2, 4, 8, 16)


def main() -> None:
    print(f"int8 kernel: {int8_kernel.variant_name() or int8_kernel.unavailable_reason()}")
    pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)
    native = pair.target_runner
    print(f"runtime: {native.name}")
    model = pair.target.model
    read = sum(layer.weight.numel() + 4 * layer.scale.numel() for layer in _products(native))
    print(f"weights a step reads: {read / 1e6:.1f} MB (the 121 products' int8 rows and scales)")
    compiled = StaticTorchRuntime(model, native.device, native.capacity, compile=True)
    compiled.native = None  # what every model the native forward cannot run gets
    started = time.perf_counter()
    compiled.start_background_work()
    compiled.compiler.wait()
    print(f"compiled in {time.perf_counter() - started:.0f} s ({compiled.compiler.note or 'every shape'})", file=sys.stderr)
    context = list(range(1000, 1200))
    medians: dict[tuple[str, int], float] = {}
    for tokens in TOKENS:
        times: dict[str, list[float]] = {"native": [], "compiled": []}
        for runtime in (native, compiled):
            time_verify(runtime, context, tokens)  # warm
        for _ in range(REPEATS):
            times["native"].append(1000 * time_verify(native, context, tokens))
            times["compiled"].append(1000 * time_verify(compiled, context, tokens))
        for name, values in times.items():
            medians[name, tokens] = statistics.median(values)
        print(f"{tokens:2d} tokens: native {medians['native', tokens]:6.2f} ms, compiled {medians['compiled', tokens]:6.2f} ms "
              f"({medians['compiled', tokens] / medians['native', tokens]:.2f}x)", flush=True)
    print(f"native step: {read / medians['native', 1] / 1e6:.1f} GB/s of weights")
    for name in ("native", "compiled"):
        ratios = ", ".join(f"{medians[name, tokens] / medians[name, 1]:.2f}" for tokens in TOKENS)
        print(f"{name}: verify(k) / verify(1) for k = {', '.join(map(str, TOKENS))}: {ratios}")


def _products(runtime: StaticTorchRuntime):
    """The int8 layers one forward multiplies by: per layer the joined q/k/v, o, the joined
    gate/up and down; then the LM head."""
    forward, decoder = runtime.forward_pass, runtime.forward_pass.model.model
    for layer, joined in zip(decoder.layers, forward.joined):
        yield from (joined.qkv, layer.self_attn.o_proj, joined.gate_up, layer.mlp.down_proj)
    yield forward.model.lm_head


if __name__ == "__main__":
    main()
