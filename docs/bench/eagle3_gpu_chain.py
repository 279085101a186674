"""What an EAGLE-3 head's call costs on a GPU as a chain drafts: each call one token more of
context, so each attention call has a new key length unless the layer reads its whole cache
(`_TorchHeadLayer.static_shapes`, on by default on a GPU). Issue 20: in the bench on the H100
(2026-11-27) a head call cost 15.1 ms in chains against 2.5 ms repeated at one shape.

A head of the demo target's shape with random weights, bf16, a context of CONTEXT slots, then
STEPS one-token calls that each extend it (as a chain of drafted tokens does), every call's
outputs copied to the host as the drafter reads them. Both ways alternate in one process; the
median ms per call, and the same with torch's attention backends named one at a time.

  PYTHONPATH=. python3 docs/bench/eagle3_gpu_chain.py [cpu]     (cpu: only to try the script)
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.runtime.eagle3 import _TorchHeadLayer
from engine.runtime.eagle3_head import Eagle3Head

from eagle3_head_call import CONFIG

CONTEXT = 200
STEPS = 64
ROUNDS = 5


def chain_ms(layer: _TorchHeadLayer) -> float:
    """Median ms of one call of a chain that grows the context one token a call."""
    hidden = CONFIG.hidden_size
    times = []
    for _ in range(ROUNDS):
        prompt = torch.zeros(CONTEXT, hidden, dtype=layer.dtype)
        layer.run(0, [1] * CONTEXT, prompt, list(range(CONTEXT)), torch.ones(CONTEXT, CONTEXT).tril().bool(), 1)
        start = CONTEXT
        for step in range(STEPS):
            visible = torch.ones(1, start + 1, dtype=torch.bool)
            if embeddings_device(layer).type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            layer.run(start, [step + 2], torch.zeros(1, hidden, dtype=layer.dtype), [start], visible, 1)
            times.append(time.perf_counter() - began)  # run() returns host tensors: the call is done
            start += 1
    return 1000 * statistics.median(times)


def embeddings_device(layer: _TorchHeadLayer) -> torch.device:
    return layer.embeddings.device


def main() -> None:
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    torch.manual_seed(0)
    head = Eagle3Head(CONFIG)
    embeddings = torch.randn(CONFIG.vocab_size, CONFIG.hidden_size, device=device) * 0.02
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}; torch {torch.__version__}; head bf16, context {CONTEXT}, "
          f"{STEPS} one-token calls a chain, median of {ROUNDS * STEPS}")
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    for backend_name, backend in backends.items():
        row = []
        for static in (False, True):
            layer = _TorchHeadLayer(head, embeddings, torch.bfloat16, quantise=False)
            layer.static_shapes = static
            try:
                if backend is None:
                    ms = chain_ms(layer)
                else:
                    with sdpa_kernel([backend]):
                        ms = chain_ms(layer)
                row.append(f"{'whole cache' if static else 'exact length'} {ms:6.2f} ms")
            except RuntimeError as error:  # a backend that refuses this mask or shape
                row.append(f"{'whole cache' if static else 'exact length'} refused ({str(error).splitlines()[0][:60]})")
        print(f"{backend_name:10s} " + "   ".join(row), flush=True)


if __name__ == "__main__":
    main()
