"""llama.cpp's attention kernels on the CPU: its flash-attention kernel (what llama.cpp's
`auto` picks) against the plain one (what the llama.cpp runtime now asks for on the CPU).

Two contexts of the runtime over the demo target as chats run it (Q8_0, the demo pair's
8192-token context, 2 threads), one per setting. Each reads the same synthetic prompt in
512-token pieces, stopping at 300, 1,500 and 3,584 tokens of context to time a forward over
1, 2, 4, 8 and 16 new tokens (median of 9, the two settings interleaved).

  .venv/bin/python docs/bench/llamacpp_attention.py
"""
from __future__ import annotations

import statistics
import time
from unittest import mock

import torch

from engine.demo_model import demo_gguf_path
from engine.round import time_verify
from engine.runtime import llamacpp, llamacpp_library

CONTEXTS = (300, 1500, 3584)
SIZES = (1, 2, 4, 8, 16)
REPEATS = 9


def runtime(weights, setting: str) -> llamacpp.LlamaCppRuntime:
    kernel = {"flash (auto)": llamacpp_library.library().LLAMA_FLASH_ATTN_TYPE_AUTO,
              "plain": llamacpp_library.library().LLAMA_FLASH_ATTN_TYPE_DISABLED}[setting]
    with mock.patch.object(llamacpp, "attention_kernel", lambda _weights: kernel):
        return llamacpp.LlamaCppRuntime(weights, 8192, threads=2)


def main() -> None:
    torch.set_num_threads(2)
    path = llamacpp_library.quantised_copy(demo_gguf_path(), "int8")
    weights = llamacpp.load_weights(path, use_gpu=False)
    runtimes = {setting: runtime(weights, setting) for setting in ("flash (auto)", "plain")}
    prompt = [(token * 7919) % 40000 + 100 for token in range(max(CONTEXTS))]
    reading = dict.fromkeys(runtimes, 0.0)
    print(f"{path.name}, 2 threads; ms per forward of N new tokens")
    print("context  attention       " + "".join(f"{size:>8d}" for size in SIZES) + "   8 / 1")
    for context in CONTEXTS:
        for setting, model in runtimes.items():
            started = time.perf_counter()
            model.catch_up(prompt[:context])
            reading[setting] += time.perf_counter() - started
        timings = {setting: {size: [] for size in SIZES} for setting in runtimes}
        for _ in range(REPEATS):
            for size in SIZES:
                for setting, model in runtimes.items():
                    timings[setting][size].append(1000 * time_verify(model, prompt[:context], size))
        for setting in runtimes:
            medians = [statistics.median(timings[setting][size]) for size in SIZES]
            print(f"{context:7d}  {setting:14s}" + "".join(f"{ms:8.1f}" for ms in medians) + f"   {medians[3] / medians[0]:5.2f}")
    for setting, seconds in reading.items():
        print(f"reading the {max(CONTEXTS)}-token prompt, {setting}: {seconds:.1f} s ({max(CONTEXTS) / seconds:.0f} tokens/s)")


if __name__ == "__main__":
    main()
