"""Whether llama.cpp's batched verify gives a token the bits of a single-token step, per
attention setting: a greedy sequence is stepped one token at a time from a random start, then
the same tokens are run as 5-token verifies in a fresh context, and the rows compared.

  TANDEM_THREADS=2 .venv/bin/python docs/bench/llamacpp_verify_bits.py START_TOKENS STEPS
  ONLY=flash-f16,flash-q8_0 TANDEM_THREADS=2 .venv/bin/python docs/bench/llamacpp_verify_bits.py 40 300

Timings it prints are single runs, not interleaved (docs/bench/llamacpp_verify_timing.py).
"""
import sys, time
import numpy as np
from engine.demo_model import demo_gguf_path
from engine.runtime import llamacpp_context as lc
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

llama = llamacpp_library.library()
gguf = llamacpp_library.quantised_copy(demo_gguf_path(), "int8")
weights = load_weights(gguf, use_gpu=False)

SETTINGS = {
    "plain-f16": dict(flash=False, kv=1),
    "flash-f16": dict(flash=True, kv=1),
    "plain-f32": dict(flash=False, kv=0),
    "flash-f32": dict(flash=True, kv=0),
    "flash-q8_0": dict(flash=True, kv=8),
}
import os
only = os.environ.get("ONLY")
if only: SETTINGS = {k: v for k, v in SETTINGS.items() if k in only.split(",")}

def use(setting):
    kernel = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if setting["flash"] else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    lc.verifying_attention = lambda w: lc.Attention(kernel, setting["kv"])

rng = np.random.default_rng(0)
prompt = [int(t) for t in rng.integers(300, 20000, size=int(sys.argv[1]) if len(sys.argv) > 1 else 40)]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
K = 5
for name, setting in SETTINGS.items():
    use(setting)
    rt = LlamaCppRuntime(weights, 2048)
    logits = rt.forward(prompt)[-1].numpy()
    ids, step_rows = [], []
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step_rows.append(logits.copy())
        token = int(logits.argmax())
        ids.append(token)
        logits = rt.forward([token])[-1].numpy()
    step_s = (time.perf_counter() - t0) / STEPS
    rt.close()
    rt = LlamaCppRuntime(weights, 2048)
    first = rt.forward(prompt)[-1].numpy()
    verify_rows = [first]
    t0 = time.perf_counter(); calls = 0
    # verify batches of K tokens (the last kept token plus K-1 drafts), all right
    for start in range(0, STEPS - 1, K):
        chunk = ids[start:start + K]
        rows = rt.forward(chunk, logits_wanted=len(chunk)).numpy(); calls += 1
        verify_rows.extend(rows)
    verify_s = (time.perf_counter() - t0) / calls
    verify_rows = np.array(verify_rows[:STEPS]); step_rows = np.array(step_rows)
    diff = np.abs(verify_rows - step_rows).max(axis=1)
    argmax_differs = (verify_rows.argmax(1) != step_rows.argmax(1)).sum()
    top2 = np.sort(step_rows, axis=1)[:, -2:]; gap = top2[:, 1] - top2[:, 0]
    first_bad = int(np.argmax(diff > 0)) if (diff > 0).any() else -1
    print(f"{name:10s} max|d| {diff.max():.3f} median {np.median(diff):.4f} exact rows {(diff == 0).sum()}/{STEPS} first inexact pos {first_bad + len(prompt) if first_bad >= 0 else None} "
          f"argmax differs {argmax_differs}; step {step_s*1e3:.1f} ms verify{K} {verify_s*1e3:.1f} ms; gaps<1: {(gap<1).sum()}", flush=True)
    rt.close()
