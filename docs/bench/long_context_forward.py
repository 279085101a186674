"""One forward of the demo target after a long conversation, on the torch runtime (the native
forward, where it runs) and on llama.cpp: a step and an 8-token verify after 300, 1,500 and
3,584 tokens of context, median of 9 each (issue 21). One runtime at a time, in one process.

  .venv/bin/python docs/bench/long_context_forward.py
"""
from __future__ import annotations

import dataclasses
import statistics

from engine.pairs import find_pair
from engine.round import time_verify
from engine.session import load_pair

CONTEXTS = (300, 1500, 3584)
REPEATS = 9


def main() -> None:
    for runtime in ("torch", "llama.cpp"):
        pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime=runtime), lambda message, fraction: None)
        target = pair.target_runner
        for length in CONTEXTS:
            context = [1000 + (i * 7) % 5000 for i in range(length)]
            for tokens in (1, 8):
                time_verify(target, context, tokens)  # warm, and the context read
                milliseconds = statistics.median(1000 * time_verify(target, context, tokens) for _ in range(REPEATS))
                print(f"{target.name:28s} context {length:5d}: {tokens} token(s) {milliseconds:6.1f} ms", flush=True)
        pair.close()


if __name__ == "__main__":
    main()
