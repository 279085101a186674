"""Whether the compiled torch forward (the path for models the native forward cannot run) gives a
verify the logits its one-token steps give, at each thread count the budget can choose: a tiny
int8 Llama, a 10-token verify against steps, torch's threads fixed by TANDEM_THREADS per call.

  TANDEM_COMPILE=1 PYTHONPATH=. .venv/bin/python docs/bench/compiled_threads_bits.py

Found (2026-11-28, AMD EPYC Zen 4), two tries: with 2 threads throughout, a verify equalled
its steps; once the thread count had changed between calls, the verify and the steps differed by
up to 8.25e-5 at 1 thread and at 2. This is also why
tests/engine/runtime/test_compiled_forward.py's int8 verify test could fail under CI's load (once
in three fresh-clone runs).

The cause (2026-11-29): dynamo guards every compiled graph on torch's thread count (its
GLOBAL_STATE guard, `TORCH_LOGS=guards`: "num_threads": 2). At another count the guard missed and
the runtime's run-only call ran the forward eagerly, whose last bits are not the graphs'; the
int8 kernel inside the forward had set torch's count to the budget's (cpu.forward_threads). Now
the graphs are compiled and run at one count (cpu.torch_threads_held, compiled_forward.py), and
this script prints True for both counts and for both comparisons across them."""
from __future__ import annotations

import os

import torch

from engine.runtime.int8_weights import quantise_weight_only
from engine.runtime.torch_static import StaticTorchRuntime
from tests.engine.runtime.test_compiled_forward import compiled
from tests.engine.runtime.test_static_families import VOCAB
from tests.engine.tiny_models import tiny_llama


def main() -> None:
    model = quantise_weight_only(tiny_llama(seed=9, vocab_size=VOCAB, hidden=64))
    ids = [5, 9, 11, 40, 2, 7, 33, 12, 3, 8, 17, 21]
    verifying = compiled(model, native=False)
    stepping = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, compile=True, native=False)
    results = {}
    for threads in ("1", "2"):
        os.environ["TANDEM_THREADS"] = threads
        verifying.crop(0)
        verified = verifying.forward(ids, logits_wanted=10)
        stepping.crop(0)
        stepping.forward(ids[:2], logits_wanted=1)
        stepped = torch.cat([stepping.forward([token], logits_wanted=1) for token in ids[2:]])
        results[threads] = verified, stepped
        print(f"{threads} thread(s): verify equals steps: {torch.equal(verified, stepped)} "
              f"(largest difference {float((verified - stepped).abs().max()):.3g})")
    print(f"verify at 1 and 2 threads the same: {torch.equal(results['1'][0], results['2'][0])}; "
          f"steps the same: {torch.equal(results['1'][1], results['2'][1])}")


if __name__ == "__main__":
    main()
