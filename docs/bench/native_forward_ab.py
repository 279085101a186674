"""Two builds of the native forward over the same loaded demo target, call by call in one
process: the C sources of a git revision (BEFORE) against the working tree's (issue 21).

Runs on this machine drift by ±15% minutes apart, more than a kernel change is worth, so both
libraries are built here with the flags the runtime uses and the runtime's forward switches
between them call by call: a forward of k tokens after CONTEXT cached tokens, every logit
row wanted, median of REPEATS each. Also prints how far apart the two builds' logits are
(the same argmax expected; the floats differ where the arithmetic changed), each build's verify
of k tokens over its own one-token step (the two timed back to back, the median of those
ratios: the host's drift moves both alike), and how long each reads a prompt in pieces of 64
tokens.

  .venv/bin/python docs/bench/native_forward_ab.py BEFORE [TOKENS ...]
"""
from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.pairs import find_pair
from engine.round import time_verify
from engine.runtime import int8_kernel
from engine.runtime.forward_plan import NATIVE, STATIC_EAGER, RowRange
from engine.session import load_pair

REPEATS = 31
CONTEXT = 200


def main() -> None:
    before, tokens = sys.argv[1], [int(count) for count in sys.argv[2:]] or [1, 2, 3, 4, 8, 16]
    pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)
    target = pair.target_runner
    print(f"runtime: {target.name}, kernel: {int8_kernel.variant_name()}")
    variant = int8_kernel.chosen_variant()  # TANDEM_INT8_KERNEL=AVX2 compares that build
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        old_sources = []
        for source in (variant.source, int8_kernel.DECODER_SOURCE):
            path = folder / source.name
            tracked = source.resolve().relative_to(Path.cwd().resolve()).as_posix()  # run from the repository's root
            path.write_bytes(subprocess.run(["git", "show", f"{before}:{tracked}"], capture_output=True, check=True).stdout)
            old_sources.append(path)
        old_sources.append(int8_kernel.INT4_SOURCE)  # the int4 product, as it is now (older decoders never call it)
        libraries = {"before": int8_kernel.build_for_comparison(variant, folder / "before.so", tuple(old_sources)),
                     "after": int8_kernel.build_for_comparison(variant, folder / "after.so")}
        context = [1000 + (i * 7) % 5000 for i in range(CONTEXT)]
        for count in tokens:
            logits = {}
            for name, library in libraries.items():
                target.native.library = library
                target.catch_up(context)
                logits[name] = target.logits_for(context, [context[-1]] * (count - 1)).clone()
                target.crop(len(context) - 1)
            apart = float((logits["before"] - logits["after"]).abs().max())
            same = bool((logits["before"].argmax(-1) == logits["after"].argmax(-1)).all())
            times: dict[str, list[float]] = {name: [] for name in libraries}
            for _ in range(REPEATS):
                for name, library in libraries.items():
                    target.native.library = library
                    times[name].append(1000 * time_verify(target, context, count))
            medians = {name: statistics.median(values) for name, values in times.items()}
            print(f"{count:2d} tokens: before {medians['before']:6.2f} ms, after {medians['after']:6.2f} ms "
                  f"(after/before {medians['after'] / medians['before']:.3f}); logits at most {apart:.3g} apart, same argmax: {same}",
                  flush=True)
        # A verify's price in steps: each build's step and k-token verify back to back, so the
        # ratio of the two is taken within a few milliseconds
        ratios: dict[tuple[str, int], list[float]] = {}
        for repeat in range(REPEATS):
            order = list(libraries.items()) if repeat % 2 == 0 else list(libraries.items())[::-1]
            for name, library in order:
                target.native.library = library
                step = time_verify(target, context, 1)
                for count in tokens:
                    if count > 1:
                        ratios.setdefault((name, count), []).append(time_verify(target, context, count) / step)
        for name in libraries:
            print(f"{name}: verify / step, median of {REPEATS} pairs: "
                  + "  ".join(f"{count} tokens {statistics.median(ratios[(name, count)]):.2f}x" for count in tokens if count > 1))
        # A prompt: natively in pieces of 64 with either build, and as before this change, in
        # eager torch past the kernel's 16 rows.
        prompt = [1000 + (i * 7) % 5000 for i in range(400)]
        natively = target.plan
        past_the_kernels_rows = dataclasses.replace(natively, ranges=(
            RowRange(int8_kernel.most_tokens(), NATIVE, "the kernel's rows"), RowRange(None, STATIC_EAGER, "as before")))
        for name, library, plan in (("before", libraries["before"], natively), ("after", libraries["after"], natively),
                                    ("eager torch past 16 tokens", libraries["after"], past_the_kernels_rows)):
            target.native.library, target.plan = library, plan

            def read() -> float:
                target.reset()
                started = time.perf_counter()
                target.forward(prompt, logits_wanted=1)
                return time.perf_counter() - started

            read()
            print(f"{name}: a {len(prompt)}-token prompt in {1000 * statistics.median(read() for _ in range(5)):.0f} ms")
        target.plan = natively
    pair.close()


if __name__ == "__main__":
    main()
