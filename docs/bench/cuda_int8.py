"""int8 against bf16 on a CUDA GPU, in one process: the static runtime's captured graphs over
the demo target and over random-weight Llama models of 1.7B and 8B parameters (issue 21:
int8 at least as fast as bf16 at no more than 55% of the weights' memory).

Each model runs four ways, one after another on the same weights:
  bf16        the model as loaded
  bf16 unfused norms  the same without the Triton RMS norm (rms_norm_cuda.py): transformers' own
  int8        weight-only int8 (int8_weights.py), each layer one Triton kernel (int8_cuda.py)
  int8 unfused  the same int8 weights through the path without the kernel (a bf16 copy of
              the weight, the bf16 matmul, then the scale), which is what ran before
A forward over n new tokens after 200 cached tokens (round.time_verify: graph replay
included, logits read back), median of REPEATS, for n = 1 (a step) and 8 and 32 (verifies).

  python3 docs/bench/cuda_int8.py [--models demo,llama-1.7b,llama-8b] [--json FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from unittest import mock

import torch

from engine.config import ModelSpec
from engine.models import load_model
from engine.round import time_verify
from engine.runtime import int8_cuda, static_cache_forward
from engine.runtime.int8_weights import quantise_weight_only, weight_bytes
from engine.runtime.torch_static import StaticTorchRuntime

REPEATS = 30
SIZES = (1, 8, 32)
# Shapes of public models (SmolLM2-1.7B; Llama 3 8B), with random weights: speed depends on
# shapes, not on values.
RANDOM_LLAMAS = {
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True),  # --device cpu smoke runs
    "llama-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=49152, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}


def timed(model: torch.nn.Module) -> dict[int, float]:
    """ms of a forward over n new tokens, by n, on a fresh captured runtime."""
    runtime = StaticTorchRuntime(model, model.device, 1024)
    context = [token % model.config.vocab_size for token in range(1000, 1200)]
    try:
        runtime.warm_up()
        for size in SIZES:
            time_verify(runtime, context, size)  # the first call of a shape may compile Triton kernels
        return {size: 1000 * statistics.median(time_verify(runtime, context, size) for _ in range(REPEATS)) for size in SIZES}
    finally:
        runtime.close()


def random_llama(shape: dict, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, max_position_embeddings=4096)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def measure(name: str, device: str) -> dict:
    if name == "demo":
        model = load_model(ModelSpec("demo-target", "bf16", device), runtime="torch").model
    else:
        model = random_llama(RANDOM_LLAMAS[name], device)
    rows = {}
    rows["bf16"] = {"weights_mb": weight_bytes(model) / 1e6, "ms": timed(model)}
    with mock.patch.object(static_cache_forward, "fused_norm", lambda norm: norm):
        rows["bf16 unfused norms"] = {"weights_mb": rows["bf16"]["weights_mb"], "ms": timed(model)}
    quantise_weight_only(model)
    rows["int8"] = {"weights_mb": weight_bytes(model) / 1e6, "ms": timed(model)}
    with mock.patch.object(int8_cuda, "failure", lambda device, dtype: "unfused, for comparison"):
        rows["int8 unfused"] = {"weights_mb": rows["int8"]["weights_mb"], "ms": timed(model)}
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="demo,llama-1.7b,llama-8b")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script, not a measurement")
    args = parser.parse_args()
    print(f"{args.device}; torch {torch.__version__}; int8 kernel: {int8_cuda.failure(torch.device(args.device), torch.bfloat16) or 'Triton, runs'}")
    results = {}
    for name in args.models.split(","):
        rows = measure(name, args.device)
        results[name] = rows
        base = rows["bf16"]
        for way, row in rows.items():
            ms = row["ms"]
            print(f"{name:11} {way:13} weights {row['weights_mb']:8.1f} MB ({row['weights_mb'] / base['weights_mb']:.0%})  "
                  + "  ".join(f"{n} tok {ms[n]:7.2f} ms ({base['ms'][n] / ms[n]:.2f}x bf16)" for n in SIZES), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch": torch.__version__, "repeats": REPEATS, "results": results}, out, indent=2)


if __name__ == "__main__":
    sys.exit(main())
