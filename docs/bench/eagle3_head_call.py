"""The EAGLE-3 head's call, in C with int8 weights (`NativeHeadLayer`) against torch in bf16
and in fp32 with fbgemm int8 (`_TorchHeadLayer`, the two torch paths), on a head of the demo
target's shape with random weights (issue 20).

A call is what a drafting step runs: T new tokens (1 for a chain, a tree level's 4-8) over a
cache of CONTEXT slots, their logits over the 8,191-token draft vocabulary; `fuse` is the fc
over three target layers' features of one token, which every round runs once. The variants
alternate call by call in one process; medians of REPEATS.

  .venv/bin/python docs/bench/eagle3_head_call.py
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.runtime.eagle3 import _TorchHeadLayer
from engine.runtime.eagle3_head import Eagle3Config, Eagle3Head
from engine.runtime.eagle3_native import NativeHeadLayer

# SmolLM2-135M (the demo target): hidden 576, MLP 1536, 9 heads of 64 over 3 key/value heads.
CONFIG = Eagle3Config(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                      target_hidden_size=576, vocab_size=49152, draft_vocab_size=8191, layer_ids=(2, 15, 27))
CONTEXT = 200
TOKENS = (1, 4, 8)
REPEATS = 41


def head() -> Eagle3Head:
    torch.manual_seed(0)
    made = Eagle3Head(CONFIG)
    with torch.no_grad():
        for parameter in made.parameters():
            parameter.normal_(0.0, 0.02)
    return made.eval()


def main() -> None:
    embeddings = torch.randn(CONFIG.vocab_size, CONFIG.hidden_size) * 0.02
    variants = {
        "native int8 (C)": NativeHeadLayer(head(), embeddings),
        "torch bf16": _TorchHeadLayer(head(), embeddings, torch.bfloat16, quantise=False),
        "torch fp32 + fbgemm int8": _TorchHeadLayer(head(), embeddings, torch.float32, quantise=True),
    }
    ids = torch.randint(0, CONFIG.vocab_size, (CONTEXT + max(TOKENS),)).tolist()
    features = torch.randn(CONTEXT, CONFIG.feature_width)
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for layer in variants.values():  # the context, read once
            inputs = layer.fuse(features)
            layer.run(0, ids[:CONTEXT], inputs, list(range(CONTEXT)), torch.ones(CONTEXT, CONTEXT).tril().bool(), 1)
        for _ in range(REPEATS):
            for name, layer in variants.items():
                started = time.perf_counter()
                layer.fuse(features[-1:])
                times.setdefault((name, "fuse"), []).append(time.perf_counter() - started)
                for count in TOKENS:
                    inputs = (torch.randn(count, CONFIG.hidden_size) * 0.1).to(layer.dtype)
                    visible = torch.ones(count, CONTEXT + count, dtype=torch.bool)
                    visible[:, CONTEXT:] = torch.eye(count, dtype=torch.bool)  # a tree level: each sees itself
                    started = time.perf_counter()
                    layer.run(CONTEXT, ids[CONTEXT:CONTEXT + count], inputs, [CONTEXT] * count, visible, count)
                    times.setdefault((name, f"{count} token(s)"), []).append(time.perf_counter() - started)
    print(f"threads {torch.get_num_threads()}, context {CONTEXT} slots, median of {REPEATS} (ms)")
    columns = ["fuse"] + [f"{count} token(s)" for count in TOKENS]
    print(f"{'':26}" + "".join(f"{column:>13}" for column in columns))
    for name in variants:
        print(f"{name:26}" + "".join(f"{statistics.median(times[(name, column)]) * 1e3:13.3f}" for column in columns))


if __name__ == "__main__":
    main()
