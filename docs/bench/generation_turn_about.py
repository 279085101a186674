"""Tandem's generation against llama-bench's on a GGUF file, turn about in pairs: a model folder
loaded once at PRECISION (int4-wo unless the environment says otherwise: int8-wo against a Q8_0
file) on the native forward, then ROUNDS times its generation as
llama-bench times it (GENERATED greedy one-token steps after an 8-token prompt, int4_forward.py)
followed at once by `llama-bench -p 0 -n GENERATED -r 1` on the file. Each pair runs within
seconds, so the host's slow and fast phases (they move either side's figure by 15-30% over
minutes on the 2-core development VMs) fall on both of its halves; the pairs' ratios are
printed, and their median.

  TANDEM_THREADS=2 .venv/bin/python docs/bench/generation_turn_about.py FOLDER GGUF LLAMA_BENCH [ROUNDS]
  PRECISION=int8-wo TANDEM_THREADS=2 .venv/bin/python docs/bench/generation_turn_about.py FOLDER Q8_0.gguf LLAMA_BENCH
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from engine.runtime.torch_load import _weights_in_memory
from engine.runtime.torch_static import StaticTorchRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_forward import GENERATED, generation_rate, step_bytes  # noqa: E402


def llama_bench_rate(llama_bench: str, gguf: Path, threads: int) -> float:
    """llama-bench's generation, tokens per second, one repetition."""
    output = subprocess.run(
        [llama_bench, "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(GENERATED), "-r", "1", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout
    return float(json.loads(output)[0]["avg_ts"])


def main() -> None:
    folder, gguf, llama_bench = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    threads = int(os.environ.get("TANDEM_THREADS", "2"))
    precision = os.environ.get("PRECISION", "int4-wo")
    model = _weights_in_memory(folder, torch.device("cpu"), precision)
    runtime = StaticTorchRuntime(model, torch.device("cpu"), 512)
    assert runtime.native is not None, runtime.name
    print(f"{precision}: a step reads {step_bytes(model) / 1e9:.2f} GB of weights; {threads} threads", flush=True)
    generation_rate(runtime)  # warm
    ratios = []
    for round_ in range(1, rounds + 1):
        ours = generation_rate(runtime)
        theirs = llama_bench_rate(llama_bench, gguf, threads)
        ratios.append(ours / theirs)
        print(f"pair {round_}: {precision} {ours:.1f} tok/s, llama-bench tg{GENERATED} {theirs:.1f} tok/s: {ratios[-1]:.2f}x", flush=True)
    print(f"median of {rounds} pairs: {statistics.median(ratios):.2f}x (from {min(ratios):.2f}x to {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
