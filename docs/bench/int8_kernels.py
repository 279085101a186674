"""The CPU's int8 matmul kernels over the demo target's 211 linear layers (issue 21).

For M = 1, 2, 4, 8, 16 rows, the median of 12 passes over every linear layer's shape
(30 layers of q, k, v, o, gate, up, down, and the 49152-row head), random int8 weights:

- `_weight_int8pack_mm`: bf16 activations, int8 weights, dequantised in the kernel (what
  Int8Linear ran on the CPU before);
- `_int_mm`: int8 activations times int8 weights with int32 sums, the weight read through a
  transposed view as Int8Linear does;
- `_int_mm` with M rows that were float: one level of per-token rounding included, eagerly;
- `integer_product`, what Int8Linear runs on the CPU: two levels of rounding, 2M rows in one
  `_int_mm`, and the scaling back to float32;
- the same with q/k/v and gate/up joined (`join_rows`): 121 matmuls instead of 211.

  .venv/bin/python docs/bench/int8_kernels.py
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.runtime.int8_weights import integer_product

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152


def median_ms(call, repeats: int = 12) -> float:
    call(), call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    shapes = [shape for _ in range(LAYERS) for shape in ((HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))]
    shapes.append((VOCAB, HIDDEN))
    weights = [torch.randint(-127, 128, shape, dtype=torch.int8) for shape in shapes]
    joined_shapes = [shape for _ in range(LAYERS) for shape in ((HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))]
    joined_weights = [torch.randint(-127, 128, shape, dtype=torch.int8) for shape in joined_shapes + [(VOCAB, HIDDEN)]]
    unit_scales = [torch.ones(shape[0], dtype=torch.bfloat16) for shape in shapes]
    print("rows   int8pack_mm   _int_mm   _int_mm + rounding   integer_product   joined (121)   (ms per pass over the 211 layers)")
    for rows in (1, 2, 4, 8, 16):
        floats = {width: torch.randn(rows, width) for width in (HIDDEN, INTERMEDIATE)}
        halves = {width: x.to(torch.bfloat16) for width, x in floats.items()}
        integers = {width: torch.randint(-127, 128, (rows, width), dtype=torch.int8) for width in (HIDDEN, INTERMEDIATE)}

        def packed():
            for weight, scale in zip(weights, unit_scales):
                torch._weight_int8pack_mm(halves[weight.shape[1]], weight, scale)

        def integer():
            for weight in weights:
                torch._int_mm(integers[weight.shape[1]], weight.t())

        def rounded():
            for weight in weights:
                x = floats[weight.shape[1]]
                scale = x.abs().amax(dim=1, keepdim=True) / 127.0
                torch._int_mm(torch.round(x / scale).to(torch.int8), weight.t())

        def shipped(layers=weights):
            for weight in layers:
                integer_product(floats[weight.shape[1]], weight)

        print(f"{rows:4d}   {median_ms(packed):11.1f}   {median_ms(integer):7.1f}   {median_ms(rounded):18.1f}"
              f"   {median_ms(shipped):15.1f}   {median_ms(lambda: shipped(joined_weights)):12.1f}")


if __name__ == "__main__":
    main()
