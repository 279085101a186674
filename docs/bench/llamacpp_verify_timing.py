"""ms per forward of 1, 5 and 9 new tokens (a step, `chain`'s verify at K = 4 and at K = 8)
after CONTEXTS random tokens, llama.cpp's plain attention over an F16 cache against flash
attention over a Q8_0 cache (the runtime's on the CPU), one runtime each over the demo target
(Q8_0), the settings interleaved, medians of REPEATS; each forward is cropped back.

  .venv/bin/python docs/bench/llamacpp_verify_timing.py 300,1500 9
"""
import sys, time
import numpy as np
from engine.demo_model import demo_gguf_path
from engine.runtime import llamacpp_context as lc
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

llama = llamacpp_library.library()
weights = load_weights(llamacpp_library.quantised_copy(demo_gguf_path(), "int8"), use_gpu=False)
SETTINGS = {"plain-f16": (False, 1), "flash-q8_0": (True, 8)}
def open_with(flash, kv):
    lc.verifying_attention = lambda w: lc.Attention(llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED, kv)
    return LlamaCppRuntime(weights, 4096)
rng = np.random.default_rng(0)
for context in [int(c) for c in sys.argv[1].split(",")]:
    prompt = [int(t) for t in rng.integers(300, 20000, size=context)]
    runtimes = {}
    for name, (flash, kv) in SETTINGS.items():
        rt = open_with(flash, kv); t0 = time.perf_counter(); rt.forward(prompt); runtimes[name] = (rt, time.perf_counter() - t0)
    times = {(name, n): [] for name in SETTINGS for n in (1, 5, 9)}
    for repeat in range(int(sys.argv[2]) if len(sys.argv) > 2 else 15):
        for n in (1, 5, 9):
            for name, (rt, _) in runtimes.items():
                t0 = time.perf_counter(); rt.forward(list(range(500, 500 + n)), logits_wanted=n); times[(name, n)].append(time.perf_counter() - t0); rt.crop(context)
    for name, (rt, prefill) in runtimes.items():
        print(f"context {context:5d} {name:10s} prefill {prefill:.2f} s  " + "  ".join(f"{n}: {np.median(times[(name, n)])*1e3:6.1f} ms" for n in (1, 5, 9)), flush=True)
        rt.close()
