"""The int8 kernel's multi-token products against the core's VPDPBUSD ceiling, one thread,
alternating in one process (issue 21: why a verify of 8 tokens cannot cost 1.5x a step here).

The ceiling is vpdpbusd_peak.c's loop (16 accumulators, a weight load from L1 per two
instructions: the kernel's inner loop with nothing else). The kernel runs the demo target's
LM head shape (49,152 x 576, 28 MB of int8: from L3) for 1 and 8 tokens; each token is
rounded in two levels, so it costs 2 x rows x ceil(576 / 64) VPDPBUSD. Medians of 15 rounds.

  .venv/bin/python docs/bench/vpdpbusd_peak.py      (AVX-512 VNNI CPUs; needs cc)
"""
from __future__ import annotations

import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from engine.runtime.int8_kernel import kernel_product, weight_row_sums

ROWS, WIDTH, ROUNDS = 49152, 576, 15


def ceiling() -> ctypes.CDLL:
    folder = Path(tempfile.mkdtemp())
    library = folder / "peak.so"
    subprocess.run(["cc", "-O3", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-shared", "-fPIC", "-o", str(library),
                    str(Path(__file__).with_name("vpdpbusd_peak.c"))], check=True)
    loaded = ctypes.CDLL(str(library))
    loaded.tandem_vpdpbusd_rate.argtypes = [ctypes.c_long]
    loaded.tandem_vpdpbusd_rate.restype = ctypes.c_double
    return loaded


def main() -> None:
    torch.set_num_threads(1)
    peak = ceiling()
    weight = torch.randint(-127, 128, (ROWS, WIDTH), dtype=torch.int8)
    sums = weight_row_sums(weight)
    per_token = 2 * ROWS * -(-WIDTH // 64)
    rates: dict[str, list[float]] = {"ceiling": [], "kernel, 1 token": [], "kernel, 8 tokens": [], "8 tokens' extra 7": []}
    for _ in range(ROUNDS):
        rates["ceiling"].append(peak.tandem_vpdpbusd_rate(20000))
        seconds = {}
        for tokens in (1, 8):
            x = torch.randn(tokens, WIDTH)
            kernel_product(x, weight, sums)
            started = time.perf_counter()
            for _ in range(5):
                kernel_product(x, weight, sums)
            seconds[tokens] = (time.perf_counter() - started) / 5
            rates[f"kernel, {tokens} token" + ("s" if tokens > 1 else "")].append(tokens * per_token / seconds[tokens] / 1e9)
        rates["8 tokens' extra 7"].append(7 * per_token / (seconds[8] - seconds[1]) / 1e9)
    print(f"VPDPBUSD per ns, one thread, median of {ROUNDS}:")
    for name, values in rates.items():
        print(f"  {name:20} {statistics.median(values):5.2f}")


if __name__ == "__main__":
    main()
