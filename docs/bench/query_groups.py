"""A long prompt's read and the steps after it on the native forward, for a random int8 Llama of
the demo target's width (9 query heads of 64, 6 layers) with 9 or 3 key/value heads: one query
head per key/value head, or three (the demo's). This process's CPU seconds, so run it with
TANDEM_THREADS=1 to time the work alone, whatever else the cores run.

Why: the bf16 build scores a block of keys against several queries at once (simd.h,
v_dot_key_block), and a model with one query head per key/value head gives a token only one.

  TANDEM_THREADS=1 .venv/bin/python docs/bench/query_groups.py [TOKENS] [STEPS]
"""
from __future__ import annotations

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.runtime.int8_weights import quantise_weight_only
from engine.runtime.torch_static import StaticTorchRuntime


def measure(kv_heads: int, tokens: int, steps: int) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=576, intermediate_size=1536, num_hidden_layers=6,
                         num_attention_heads=9, num_key_value_heads=kv_heads, max_position_embeddings=tokens + steps + 64,
                         tie_word_embeddings=False)
    runtime = StaticTorchRuntime(quantise_weight_only(LlamaForCausalLM(config).eval()), torch.device("cpu"), tokens + steps)
    started = time.process_time()
    runtime.forward([(i * 7) % 4000 for i in range(tokens)])
    read = time.process_time() - started
    started = time.process_time()
    for token in range(steps):
        runtime.forward([token])
    step = (time.process_time() - started) / steps
    heads = "1 query head" if kv_heads == 9 else f"{9 // kv_heads} query heads"
    return f"{heads} per key/value head, {tokens} tokens: read {read:.2f} s, a step {1000 * step:.2f} ms (CPU)"


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    for kv_heads in (9, 3):
        print(measure(kv_heads, tokens, steps), flush=True)


if __name__ == "__main__":
    main()
