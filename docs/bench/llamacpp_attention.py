"""llama.cpp's attention on the CPU: its flash-attention kernel (what llama.cpp chooses by
default) against the plain one, over its default f16 KV cache, the plain one over an f32
cache, and flash attention over a q8_0 cache (what the llama.cpp runtime asks for on the
CPU: `llamacpp_context.verifying_attention`).

Contexts of the runtime over the demo target as chats run it (Q8_0, the demo pair's
8192-token context, 2 threads), one per setting. Each reads the same synthetic prompt in
512-token pieces, stopping at 300, 1,500 and 3,584 tokens of context to time a forward over
1, 2, 4, 8 and 16 new tokens (median of 9, the settings interleaved). Then, per setting, how
far a token's logits from chain-like verifies (5 tokens at a time, the rejected ones cropped,
as `chain` does) are from the same tokens' logits stepped one at a time, after a 300-token
context (0: greedy speculation writes exactly what plain decoding writes; flash attention
over f16 gives 0 after a 60-token context and not after 300, the plain kernel never, flash
attention over q8_0 always).

  .venv/bin/python docs/bench/llamacpp_attention.py
"""
from __future__ import annotations

import contextlib
import random
import statistics
import time
from unittest import mock

import torch

from engine.demo_model import demo_gguf_path
from engine.round import time_verify
from engine.runtime import llamacpp, llamacpp_context, llamacpp_library

CONTEXTS = (300, 1500, 3584)
SIZES = (1, 2, 4, 8, 16)
REPEATS = 9


@contextlib.contextmanager
def attention(flash: bool, cache_type: str):
    api = llamacpp_library.library()
    kernel = api.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else api.LLAMA_FLASH_ATTN_TYPE_DISABLED
    chosen = llamacpp_context.Attention(kernel, getattr(api, f"GGML_TYPE_{cache_type.upper()}"))
    with mock.patch.object(llamacpp_context, "verifying_attention", lambda _weights: chosen):
        yield


SETTINGS = {
    "flash, f16": (True, "f16"), "plain, f16": (False, "f16"), "plain, f32": (False, "f32"), "flash, q8_0": (True, "q8_0"),
}


def chain_drift(model: llamacpp.LlamaCppRuntime, stepped: llamacpp.LlamaCppRuntime, context: list[int]) -> float:
    """Largest |logit| difference between chain-like verifies and one-token steps."""
    rng = random.Random(0)
    follow = [rng.randrange(200, 40000) for _ in range(60)]
    for runtime in (model, stepped):
        runtime.logits_for(context)
    steps = torch.cat([stepped.forward([token]) for token in follow])
    done, worst = 0, 0.0
    while done + 5 <= len(follow):
        verified = model.forward(follow[done:done + 5], logits_wanted=5)
        kept = rng.randint(1, 5)
        worst = max(worst, float((verified[:kept] - steps[done:done + kept]).abs().max()))
        model.crop(len(context) + done + kept)
        done += kept
    return worst


def main() -> None:
    torch.set_num_threads(2)
    path = llamacpp_library.quantised_copy(demo_gguf_path(), "int8")
    weights = llamacpp.load_weights(path, use_gpu=False)
    runtimes = {}
    for name, (flash, cache_type) in SETTINGS.items():
        with attention(flash, cache_type):
            runtimes[name] = llamacpp.LlamaCppRuntime(weights, 8192, threads=2)
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
    for name, (flash, cache_type) in SETTINGS.items():
        with attention(flash, cache_type):
            pair = [llamacpp.LlamaCppRuntime(weights, 8192, threads=2) for _ in range(2)]
        print(f"chain-like verifies against steps, {name}: largest logit difference {chain_drift(*pair, prompt[:300]):.4f}")
        for runtime in pair:
            runtime.close()


if __name__ == "__main__":
    main()
