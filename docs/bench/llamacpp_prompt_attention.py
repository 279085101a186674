"""Prompt reading and a step on Tandem's llama.cpp runtime: its verifying attention (flash over a
Q8_0 cache on the CPU) alternated with the library's default (flash auto, F16 cache), a fresh
runtime per read, to set beside `llama-bench -p N -n 8` on the same file (issue 47, item 4).

  .venv/bin/python docs/bench/llamacpp_prompt_attention.py MODEL.gguf 128[,512,...]
"""
import sys, time
import numpy as np
from pathlib import Path
from engine.runtime import llamacpp_context as lc
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights
llama = llamacpp_library.library()
weights = load_weights(Path(sys.argv[1]), use_gpu=False)
original = lc.verifying_attention
settings = {"runtime's (flash, q8_0 kv)": original,
            "flash auto, f16 kv": lambda w: lc.Attention(llama.LLAMA_FLASH_ATTN_TYPE_AUTO, None)}
rng = np.random.default_rng(0)
for count in [int(c) for c in sys.argv[2].split(",")]:
    prompt = [int(t) for t in rng.integers(300, 20000, size=count)]
    for repeat in range(2):
        for name, attention in settings.items():
            lc.verifying_attention = attention
            rt = LlamaCppRuntime(weights, 4096)
            rt.forward(prompt[:8])
            rt.crop(0) if hasattr(rt, "crop") else None
            t0 = time.perf_counter(); rt.forward(prompt); dt = time.perf_counter() - t0
            t1 = time.perf_counter()
            for i in range(8): rt.forward([500 + i])
            step = (time.perf_counter() - t1) / 8
            print(f"{count} tokens {name:28s} prompt {dt:.2f} s ({count/dt:.1f} tok/s), step {step*1e3:.1f} ms threads {rt._context.threads if hasattr(rt,'_context') else '?'}", flush=True)
            rt.close()
