"""The native forward built for CPUs without AVX-512, against llama.cpp, on this CPU (issue 21).

Most desktop CPUs have AVX2 (AMD before Zen 4, Intel's desktop parts since Alder Lake) or
AVX-VNNI, not AVX-512; on those the demo pair loads on llama.cpp, because the native forward
was measured faster than llama.cpp only with its AVX-512 VNNI build. This builds the native
forward's C sources as each kernel variant (int8_kernel.VARIANTS: a CPU with only those
features would build the same code) and times, over the same loaded int8 demo target, a
one-token step and a verify of each TOKENS count after CONTEXT cached tokens, and the read of a
PROMPT-token prompt (the native forward in pieces of 64), alternating call by call with
Tandem's llama.cpp runtime over the demo GGUF (built by llama-cpp-python for this CPU: with
AVX-512, a stronger baseline than such a CPU's llama.cpp, so the ratios are on the safe side).
Median of REPEATS each (PROMPT_REPEATS for prompts), 2 threads.

  PYTHONPATH=. .venv/bin/python docs/bench/native_variants.py [TOKENS ...]
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.pairs import find_pair
from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.session import load_pair

REPEATS = 31
CONTEXT = 200
PROMPT = 400
PROMPT_REPEATS = 5


def prompt_read(runtime) -> float:
    """Seconds to read a fresh PROMPT-token prompt (one logits row wanted)."""
    runtime.reset()
    started = time.perf_counter()
    runtime.forward([1000 + (i * 11) % 5000 for i in range(PROMPT)], logits_wanted=1)
    return time.perf_counter() - started


def main() -> None:
    tokens = [int(count) for count in sys.argv[1:]] or [1, 4, 8]
    demo = find_pair("demo")
    native_pair = load_pair(dataclasses.replace(demo, draft=None, runtime="torch"), lambda message, fraction: None)
    llama_pair = load_pair(dataclasses.replace(demo, draft=None, runtime="llama.cpp"), lambda message, fraction: None)
    native, llama = native_pair.target_runner, llama_pair.target_runner
    print(f"runtimes: {native.name} / {llama.name}; this CPU builds {int8_kernel.variant_name()}")
    context = [1000 + (i * 7) % 5000 for i in range(CONTEXT)]
    runnable = [v for v in int8_kernel.VARIANTS if v.needs <= int8_kernel.cpu_flags()]
    with tempfile.TemporaryDirectory() as scratch:
        libraries = {v.name: int8_kernel.build_for_comparison(v, Path(scratch) / f"{i}.so") for i, v in enumerate(runnable)}
        times: dict[tuple[str, int], list[float]] = {}
        for repeat in range(REPEATS):
            contenders = [*libraries, "llama.cpp"]
            for name in contenders[repeat % len(contenders):] + contenders[:repeat % len(contenders)]:
                if name in libraries:
                    native.native.library = libraries[name]
                runtime = llama if name == "llama.cpp" else native
                for count in tokens:
                    times.setdefault((name, count), []).append(1000 * time_verify(runtime, context, count))
                if repeat < PROMPT_REPEATS * len(contenders):
                    times.setdefault((name, "prompt"), []).append(1000 * prompt_read(runtime))
    medians = {key: statistics.median(values) for key, values in times.items()}
    print(f"ms, median of {REPEATS} after {CONTEXT} tokens (a {PROMPT}-token prompt: of {PROMPT_REPEATS}); (x llama.cpp) below each")
    columns = [*tokens, "prompt"]
    print(f"{'':14s}" + "".join(f"{count:>10d} tok" if count != "prompt" else f"{'prompt':>14s}" for count in columns))
    for name in [*libraries, "llama.cpp"]:
        row = "".join(f"{medians[(name, count)]:14.2f}" for count in columns)
        ratio = "".join(f"{medians[(name, count)] / medians[('llama.cpp', count)]:13.2f}x" for count in columns)
        print(f"{name:14s}{row}\n{'':14s}{ratio}")
    native_pair.close()
    llama_pair.close()


if __name__ == "__main__":
    main()
