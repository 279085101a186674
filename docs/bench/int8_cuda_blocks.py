"""The int8 Triton kernel's block shape for 17-64 rows (verifies of 17-64 tokens), chosen by
measurement on a GPU (issue 21: int8 at 32 tokens ran 0.90-0.96x bf16 on an H100 with one
64x64 block shape, which gives the demo's 1536-wide layers only 24 column blocks for 132
multiprocessors).

1. Each candidate shape's kernel time over one decoder layer's products at 32 rows, for the
   demo target's and random 1.7B and 8B Llama layers, against bf16's `F.linear` on the same
   shapes: every product captured 20 times in one CUDA graph, so launches do not count.
2. The whole forward (int8_cuda.py's `timed`: the static runtime's captured graphs after 200
   cached tokens, 1 / 8 / 32 new tokens) in bf16, int8 with the shipped shape, and int8 with
   the best candidate, on the same weights in one process.

  python3 docs/bench/int8_cuda_blocks.py [--models demo,llama-1.7b,llama-8b] [--forwards MODELS] [--json FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from cuda_int8 import RANDOM_LLAMAS, random_llama, timed  # noqa: E402

from engine.config import ModelSpec  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.runtime import int8_cuda  # noqa: E402
from engine.runtime.int8_weights import quantise_weight_only  # noqa: E402

ROWS = 32
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); the first is what int8_cuda shipped for 17-64 rows
# until this script's run on an H100 (2026-11-27) chose the fifth
CANDIDATES = (
    (64, 64, 128, 4, 4),
    (32, 32, 256, 4, 4),
    (32, 64, 128, 4, 4),
    (32, 32, 128, 4, 4),
    (16, 32, 256, 4, 4),
    (32, 64, 256, 4, 3),
    (64, 32, 128, 4, 4),
)
SHAPES = {  # (inputs, outputs) of one layer's products: q, k, v, o, gate, up, down
    "demo": (576, 576, 192, 1536),
    "llama-1.7b": (2048, 2048, 2048, 8192),
    "llama-8b": (4096, 4096, 1024, 14336),
}
COPIES = 20


def layer_products(hidden: int, query: int, kv: int, inner: int) -> list[tuple[int, int]]:
    return [(hidden, query), (hidden, kv), (hidden, kv), (query, hidden), (hidden, inner), (hidden, inner), (inner, hidden)]


def graph_ms(run) -> float:
    """ms of one call of `run`, from a CUDA graph of COPIES calls, median of 20 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(COPIES):
            run()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / COPIES)
    return statistics.median(times)


def sweep(name: str) -> dict:
    products = layer_products(*SHAPES[name])
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = {k: torch.randn(ROWS, k, device="cuda", generator=generator).to(torch.bfloat16) for k, _ in products}
    bf16 = [torch.randn(n, k, device="cuda", generator=generator).to(torch.bfloat16) for k, n in products]
    int8 = [torch.randint(-127, 128, (n, k), device="cuda", generator=generator, dtype=torch.int8) for k, n in products]
    scales = [torch.rand(n, device="cuda", generator=generator) / 64 for _, n in products]
    result = {"bf16": graph_ms(lambda: [F.linear(x[w.shape[1]], w) for w in bf16])}
    for blocks in CANDIDATES:
        with mock.patch.object(int8_cuda, "_blocks", lambda rows, outputs, blocks=blocks: blocks):
            try:
                result[str(blocks)] = graph_ms(lambda: [int8_cuda.linear(x[w.shape[1]], w, s, None) for w, s in zip(int8, scales)])
            except Exception as error:  # noqa: BLE001 -- a shape Triton refuses is reported, not fatal
                result[str(blocks)] = f"failed: {type(error).__name__}: {error}"[:200]
    return result


def whole_forwards(name: str, best: tuple) -> dict:
    if name == "demo":
        model = load_model(ModelSpec("demo-target", "bf16", "cuda"), runtime="torch").model
    else:
        model = random_llama(RANDOM_LLAMAS[name], "cuda")
    rows = {"bf16": timed(model)}
    quantise_weight_only(model)
    rows["int8 shipped"] = timed(model)  # since that run, the same shape as the best at 32 rows
    shipped = int8_cuda._blocks

    def with_best(rows_, outputs):
        return best if 16 < rows_ <= 64 else shipped(rows_, outputs)

    with mock.patch.object(int8_cuda, "_blocks", with_best):
        rows[f"int8 {best}"] = timed(model)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="demo,llama-1.7b,llama-8b")
    parser.add_argument("--forwards", help="models whose whole forward is timed (default: --models)")
    parser.add_argument("--json")
    args = parser.parse_args()
    names = args.models.split(",")
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; int8 kernel: {int8_cuda.failure(torch.device('cuda'), torch.bfloat16) or 'Triton, runs'}")
    sweeps = {}
    for name in names:
        sweeps[name] = sweep(name)
        print(f"{name} at {ROWS} rows, one layer's products (ms): " + ", ".join(
            f"{way} {ms:.4f}" if isinstance(ms, float) else f"{way} {ms}" for way, ms in sweeps[name].items()), flush=True)
    # the candidate with the smallest sum over the models of (its time / bf16's)
    scored = {blocks: sum(sweeps[n][str(blocks)] / sweeps[n]["bf16"] for n in names)
              for blocks in CANDIDATES if all(isinstance(sweeps[n][str(blocks)], float) for n in names)}
    best = min(scored, key=scored.get)
    print(f"best at {ROWS} rows: {best} (mean time / bf16's {scored[best] / len(names):.3f}; shipped {scored.get(CANDIDATES[0], float('nan')) / len(names):.3f})", flush=True)
    forwards = {}
    for name in (args.forwards or args.models).split(","):
        forwards[name] = whole_forwards(name, best)
        base = forwards[name]["bf16"]
        for way, ms in forwards[name].items():
            print(f"{name:11} {way:28} " + "  ".join(f"{n} tok {ms[n]:6.2f} ms ({base[n] / ms[n]:.2f}x bf16)" for n in ms), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": ROWS,
                                               "sweeps": sweeps, "best": best, "forwards": forwards}, indent=2))


if __name__ == "__main__":
    main()
