"""The least time the native forward can take to read a prompt on this CPU, from what its
multiply instructions can do here, beside what a read takes (issue 45, item 5).

A prompt's read is mostly two kinds of multiply-add: the int8 products (each token rounded
to int8 in two levels, so two VPDPBUSD passes over every weight, 64 byte products an
instruction) and attention's scores and weighted values (VDPBF16PS on the AVX-512 BF16 build,
32 products an instruction; float32 FMAs on the others, 16). docs/bench/multiply_peak.c
measures how many of each all the threads issue a second; this counts how many a read of N
tokens needs (the demo target's shape; the LM head for the last token only) and divides.
The rest of a read (rounding, softmax, the merge of attention's ranges, the threads' waits)
is what the floor leaves out. Needs a CPU with AVX-512 VNNI and BF16 and a C compiler:

  TANDEM_THREADS=2 .venv/bin/python docs/bench/read_floor.py [TOKENS ...]
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.runtime import int8_kernel
from engine.runtime.cpu import forward_threads
# The same prompts, read the same way, as the other prompt benchmark (run from this folder).
from prefill_native import load_target, prompt_of

PROBE = Path(__file__).with_name("multiply_peak.c")
FLAGS = ["-O2", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-mavx512bf16"]


def instruction_rates(threads: int) -> dict[str, float]:
    """Instructions a second, all `threads` together: {"vpdpbusd": …, "vdpbf16ps": …}."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        sys.exit("needs a C compiler for the probe (docs/bench/multiply_peak.c)")
    with tempfile.TemporaryDirectory() as scratch:
        probe = Path(scratch) / "multiply_peak"
        subprocess.run([compiler, *FLAGS, str(PROBE), "-o", str(probe)], check=True)
        printed = subprocess.run([str(probe)], env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                                 capture_output=True, text=True, check=True).stdout
    return {name: float(rate) for name, rate in re.findall(r"^(\w+) ([0-9.e+]+) per second$", printed, re.M)}


def multiply_adds(config, tokens: int) -> tuple[float, float]:
    """(int8 products' multiply-adds, attention's) of reading `tokens` tokens from an empty cache."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * dim + heads * dim * hidden + 3 * hidden * config.intermediate_size
    products = 2 * (tokens * layers * per_layer + hidden * config.vocab_size)  # two levels; the LM head once
    seen = tokens * (tokens + 1) / 2  # token i sees i rows
    attention = 2 * seen * heads * dim * layers  # scores and weighted values
    return products, attention


def main(counts: list[int]) -> None:
    if not {"avx512_vnni", "avx512_bf16"} <= set(Path("/proc/cpuinfo").read_text().split()):
        sys.exit("the probe needs AVX-512 VNNI and BF16 (the AVX-512 BF16 build's CPUs)")
    pair = load_target(None)
    target, threads = pair.target_runner, forward_threads()
    if not int8_kernel.attention_in_bf16():
        sys.exit(f"this CPU runs the {int8_kernel.variant_name()} build; the floor here counts bf16 attention")
    rates = instruction_rates(threads)
    print(f"{threads} threads: VPDPBUSD {rates['vpdpbusd']:.3g}/s, VDPBF16PS {rates['vdpbf16ps']:.3g}/s", flush=True)
    for count in counts:
        products, attention = multiply_adds(target.forward_pass.model.config, count)
        product_floor = products / 64 / rates["vpdpbusd"]
        attention_floor = attention / 32 / rates["vdpbf16ps"]
        target.reset()
        started = time.perf_counter()
        target.forward(prompt_of(count), logits_wanted=1)
        taken = time.perf_counter() - started
        floor = product_floor + attention_floor
        print(f"{count:5d} tokens: floor {floor:6.2f} s (int8 products {product_floor:.2f} s, attention "
              f"{attention_floor:.2f} s); read {taken:6.2f} s, the floor {floor / taken:.0%} of it", flush=True)
    pair.close()


if __name__ == "__main__":
    main([int(count) for count in sys.argv[1:]] or [2000, 7000])
