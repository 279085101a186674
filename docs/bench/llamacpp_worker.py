"""What running llama.cpp in a worker process costs (llamacpp_process.py, issue 21 item 5):
the same GGUF file loaded here and in a worker, and a target forward over n new tokens after
200 cached ones (round.time_verify: the call, its outputs copied out, the cache cropped back)
timed on both: taking turns call by call (so that the host's noise falls on both alike), or
in blocks (`--order blocks`: no runtime's threads still busy from the other's last call). Median of REPEATS per size; n = 1 is a step, 8 and 32 are verifies (32 rows of
logits are 6.3 MB for the demo's vocabulary, the most a round copies out of the worker). Then
the bare round trip of a request the worker answers without work.

  PYTHONPATH=. .venv/bin/python docs/bench/llamacpp_worker.py [--precision int8] [--order alternate|blocks] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from engine.demo_model import demo_gguf_path
from engine.round import time_verify
from engine.runtime import llamacpp_library, llamacpp_process
from engine.runtime.cpu import physical_cores
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

REPEATS = 40
SIZES = (1, 8, 32)
CONTEXT = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="int8", help="int8 (Q8_0, the target's default), fp16, fp32 or stored")
    parser.add_argument("--order", choices=("alternate", "blocks"), default="alternate",
                        help="alternate: the two runtimes take turns call by call (each then runs while the other's "
                             "llama.cpp threads may still spin, as a pair's target and draft do); blocks: all of one "
                             "runtime's calls, then all of the other's")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    stored = demo_gguf_path()
    gguf = llamacpp_library.quantised_copy(stored, args.precision) if args.precision != "stored" else stored
    threads = physical_cores()
    here_weights = load_weights(gguf, use_gpu=False)
    worker_weights = llamacpp_process.load_weights(gguf, "stored", use_gpu=False)
    runtimes = {
        "here": LlamaCppRuntime(here_weights, 1024, threads=threads),
        "worker": LlamaCppRuntime(worker_weights, 1024, threads=threads),
    }
    context = [300 + (index * 37) % 40000 for index in range(CONTEXT)]
    rows = []
    for tokens in SIZES:
        seconds = {name: [] for name in runtimes}
        for _ in range(3):  # warm-up
            for runtime in runtimes.values():
                time_verify(runtime, context, tokens)
        if args.order == "alternate":
            for _ in range(REPEATS):
                for name, runtime in runtimes.items():
                    seconds[name].append(time_verify(runtime, context, tokens))
        else:
            for name, runtime in runtimes.items():
                seconds[name] = [time_verify(runtime, context, tokens) for _ in range(REPEATS)]
        here, worker = (statistics.median(seconds[name]) * 1e3 for name in ("here", "worker"))
        rows.append({"tokens": tokens, "here_ms": round(here, 3), "worker_ms": round(worker, 3),
                     "worker_vs_here": round(worker / here, 3), "extra_ms": round(worker - here, 3)})
        print(f"{tokens:3d} tokens: here {here:7.2f} ms  worker {worker:7.2f} ms  "
              f"worker/here {worker / here:.3f}  extra {worker - here:+.2f} ms", flush=True)
    # The bare round trip: a request the worker answers at once (keep what it holds).
    context_id, held = runtimes["worker"]._context._id, len(runtimes["worker"])
    round_trips = []
    for _ in range(300):
        started = time.perf_counter()
        worker_weights.worker.exchange(("keep", context_id, held, []))
        round_trips.append(time.perf_counter() - started)
    round_trip_us = statistics.median(round_trips) * 1e6
    print(f"round trip of an empty request: {round_trip_us:.0f} us", flush=True)
    for runtime in runtimes.values():
        runtime.close()
    here_weights.close()
    worker_weights.close()
    if args.json:
        report = {"file": gguf.name, "file_type": here_weights.file_type, "threads": threads, "context": CONTEXT,
                  "repeats": REPEATS, "order": args.order, "machine": platform.processor() or platform.machine(),
                  "llama_cpp_python": llamacpp_library.version(), "rows": rows,
                  "round_trip_us": round(round_trip_us, 1)}
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
