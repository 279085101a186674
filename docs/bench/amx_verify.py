"""The demo target's verify of 1-16 tokens with AMX's tiles running the products of 2 or more
tokens, and without (the AVX-512 VNNI vector path), alternating call by call in one process
(issue 21: a verify at the price of a step). The floats are the same either way (checked
here on the logits); only the time differs. Also a prompt of 400 tokens, read in pieces of 64.

  .venv/bin/python docs/bench/amx_verify.py      (a CPU with AMX: Xeon 4th generation and later)
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from engine.pairs import find_pair
from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.session import load_pair

REPEATS = 31
CONTEXT = 200
TOKENS = (1, 2, 4, 8, 16)


def main() -> None:
    pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)
    target = pair.target_runner
    if not int8_kernel.use_amx(True):
        raise SystemExit("this CPU (or its kernel, or this build) runs no AMX")
    print(f"runtime: {target.name}, kernel: {int8_kernel.variant_name()}, threads: 2 (torch's)")
    context = [1000 + (i * 7) % 5000 for i in range(CONTEXT)]
    times: dict[tuple[int, bool], list[float]] = {}
    for count in TOKENS:
        logits = {}
        for amx in (False, True):
            int8_kernel.use_amx(amx)
            target.catch_up(context)
            logits[amx] = target.logits_for(context, [context[-1]] * (count - 1)).clone()
            target.crop(len(context) - 1)
        assert (logits[True] == logits[False]).all(), "AMX changed the logits"
        for _ in range(REPEATS):
            for amx in (False, True):
                int8_kernel.use_amx(amx)
                times.setdefault((count, amx), []).append(1000 * time_verify(target, context, count))
    step = {amx: statistics.median(times[(1, amx)]) for amx in (False, True)}
    print(f"after {CONTEXT} tokens, median of {REPEATS} (ms; x: against the same path's one-token step)")
    for count in TOKENS:
        vectors, tiles = (statistics.median(times[(count, amx)]) for amx in (False, True))
        print(f"{count:2d} tokens: vectors {vectors:6.2f} ({vectors / step[False]:.2f}x)   AMX {tiles:6.2f} ({tiles / step[True]:.2f}x)"
              f"   AMX/vectors {tiles / vectors:.2f}")
    prompt = [1000 + (i * 7) % 5000 for i in range(400)]
    for amx in (False, True):
        int8_kernel.use_amx(amx)
        seconds = []
        for _ in range(6):
            target.reset()
            started = time.perf_counter()
            target.forward(prompt, logits_wanted=1)
            seconds.append(time.perf_counter() - started)
        print(f"{'AMX' if amx else 'vectors'}: a {len(prompt)}-token prompt in {1000 * statistics.median(seconds[1:]):.0f} ms")
    int8_kernel.use_amx(True)
    pair.close()


if __name__ == "__main__":
    main()
