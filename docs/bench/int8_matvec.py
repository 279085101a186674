"""Tandem's int8 kernel against its torch version (oneDNN's `torch._int_mm`) over the demo
target's matmuls (issue 21).

One pass is the 121 int8 products of a forward of the int8 demo target with q/k/v and
gate/up joined (30 layers of 960×576, 576×576, 3072×576 and 576×1536, and the 49152×576
head), random int8 weights, eagerly, for 1–16 tokens of float activations (the kernel at every
count, though Int8Linear hands counts past the variant's `most_tokens` to the torch version). Both round each
token in two levels and give the same floats (checked). The two alternate pass by pass,
median of 15. The roofline is the weights' bytes over the read bandwidth of two threads summing
a 1 GiB float32 tensor, measured in the same run.

  .venv/bin/python docs/bench/int8_matvec.py [--variant AVX2|AVX-VNNI]   (a narrower build than this CPU's own)
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from engine.runtime import int8_kernel
from engine.runtime.int8_kernel import kernel_product, torch_product, unavailable_reason, variant_name, weight_row_sums

HIDDEN, INTERMEDIATE, QKV, LAYERS, VOCAB = 576, 1536, 960, 30, 49152
SHAPES = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)] * LAYERS + [(VOCAB, HIDDEN)]
TOKENS = (1, 2, 4, 6, 8, 16)
REPEATS = 15


def read_bandwidth_gb_s() -> float:
    data = torch.ones(1 << 28)  # 1 GiB
    seconds = []
    for _ in range(5):
        started = time.perf_counter()
        float(data.sum())
        seconds.append(time.perf_counter() - started)
    return data.numel() * 4 / min(seconds) / 1e9


def main() -> None:
    torch.set_num_threads(2)
    if "--variant" in sys.argv:  # as a CPU with only that variant's features would build it
        chosen = next(variant for variant in int8_kernel.VARIANTS if variant.name == sys.argv[sys.argv.index("--variant") + 1])
        int8_kernel.cpu_flags = lambda: chosen.needs
    print(f"kernel: {unavailable_reason() or variant_name()}")
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randint(-127, 128, shape, dtype=torch.int8, generator=generator) for shape in SHAPES]
    row_sums = [weight_row_sums(weight) for weight in weights]  # kept with the weights, as Int8Linear keeps them
    weight_bytes = sum(weight.numel() for weight in weights)
    bandwidth = read_bandwidth_gb_s()
    print(f"weights: {weight_bytes / 1e6:.1f} MB; read bandwidth {bandwidth:.1f} GB/s; roofline {weight_bytes / bandwidth / 1e6:.2f} ms a pass")
    kernels = {"torch": lambda x, weight, sums: torch_product(x, weight), "tandem": kernel_product}
    for tokens in TOKENS:
        activations = {width: torch.randn(tokens, width, generator=generator) for width in (HIDDEN, INTERMEDIATE)}
        for weight, sums in list(zip(weights, row_sums))[:4] + [(weights[-1], row_sums[-1])]:
            x = activations[weight.shape[1]]
            assert torch.equal(kernels["tandem"](x, weight, sums), kernels["torch"](x, weight, sums))
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(REPEATS):
            for name, kernel in kernels.items():
                started = time.perf_counter()
                for weight, sums in zip(weights, row_sums):
                    kernel(activations[weight.shape[1]], weight, sums)
                times[name].append(1000 * (time.perf_counter() - started))
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"{tokens:3d} tokens: torch {medians['torch']:6.2f} ms  tandem {medians['tandem']:6.2f} ms  "
              f"({medians['torch'] / medians['tandem']:.2f}×; tandem at {weight_bytes / medians['tandem'] / 1e6:.1f} GB/s)")


if __name__ == "__main__":
    main()
