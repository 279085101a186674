"""llama.cpp's attention on the CPU: its flash-attention kernel over an f16 KV cache (what
llama.cpp chooses by default), the plain kernel over an f16 cache, and the plain kernel over
an f32 cache (what the llama.cpp runtime asks for on the CPU).

Contexts of the runtime over the demo target as chats run it (Q8_0, the demo pair's
8192-token context, 2 threads), one per setting. Each reads the same synthetic prompt in
512-token pieces, stopping at 300, 1,500 and 3,584 tokens of context to time a forward over
1, 2, 4, 8 and 16 new tokens (median of 9, the settings interleaved). Then, per setting, the
largest difference between a token's logits from an 8-token forward and from one-token steps
(0: the kernels are batch-invariant, and greedy speculation writes what plain decoding does).

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


def settings() -> dict[str, llamacpp.AttentionSettings]:
    api = llamacpp_library.library()
    return {
        "flash, f16": llamacpp.AttentionSettings(api.LLAMA_FLASH_ATTN_TYPE_AUTO, None),
        "plain, f16": llamacpp.AttentionSettings(api.LLAMA_FLASH_ATTN_TYPE_DISABLED, None),
        "plain, f32": llamacpp.AttentionSettings(api.LLAMA_FLASH_ATTN_TYPE_DISABLED, api.GGML_TYPE_F32),
    }


def runtime(weights, setting: llamacpp.AttentionSettings) -> llamacpp.LlamaCppRuntime:
    with mock.patch.object(llamacpp, "attention_settings", lambda _weights: setting):
        return llamacpp.LlamaCppRuntime(weights, 8192, threads=2)


def batch_variance(model: llamacpp.LlamaCppRuntime, context: list[int]) -> float:
    """Largest |logit| difference between an 8-token forward and the same tokens one at a time."""
    follow = [(token * 104729) % 40000 + 100 for token in range(8)]
    model.catch_up(context + follow[:1])  # the whole context cached
    together = model.forward(follow, logits_wanted=8)
    model.crop(len(context))
    apart = torch.cat([model.forward([token]) for token in follow])
    model.crop(len(context))
    return float((together - apart).abs().max())


def main() -> None:
    torch.set_num_threads(2)
    path = llamacpp_library.quantised_copy(demo_gguf_path(), "int8")
    weights = llamacpp.load_weights(path, use_gpu=False)
    runtimes = {name: runtime(weights, setting) for name, setting in settings().items()}
    prompt = [(token * 7919) % 40000 + 100 for token in range(max(CONTEXTS))]
    reading = dict.fromkeys(runtimes, 0.0)
    print(f"{path.name}, 2 threads; ms per forward of N new tokens")
    print("context  attention, cache" + "".join(f"{size:>8d}" for size in SIZES) + "   8 / 1")
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
            print(f"{context:7d}  {setting:16s}" + "".join(f"{ms:8.1f}" for ms in medians) + f"   {medians[3] / medians[0]:5.2f}")
    for setting, seconds in reading.items():
        print(f"reading the {max(CONTEXTS)}-token prompt, {setting}: {seconds:.1f} s ({max(CONTEXTS) / seconds:.0f} tokens/s)")
    for setting, model in runtimes.items():
        print(f"batch variance, {setting}: {batch_variance(model, prompt[:200]):.4f}")


if __name__ == "__main__":
    main()
