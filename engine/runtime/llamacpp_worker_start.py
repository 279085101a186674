"""Where a llama.cpp worker process starts: llama.cpp's libraries first, then everything else.

On an H100 (2026-11-27) a CUDA build of llama-cpp-python 0.3.36 segfaulted inside
`llama_model_load_from_file`, on the GPU and on the CPU alike, in any process that had
imported numpy before `llama_cpp`; the same load in the other order worked (no torch in
either). The worker (`llamacpp_worker`) needs numpy, so it starts here: this module and the
packages above it import nothing but the standard library before `llama_cpp` is loaded.
`python -P -m engine.runtime.llamacpp_worker_start SOCKET BUFFER` runs it, and so does the
frozen bundle's executable given `WORKER_ARGUMENT` first (packaging/bundle_main.py).
"""
from __future__ import annotations

import sys

WORKER_ARGUMENT = "--tandem-llamacpp-worker"  # how the frozen bundle's executable is told


def run_worker(arguments: list[str]) -> int:
    try:
        import llama_cpp  # noqa: F401  (loads its libraries; see the module's note)
    except ImportError:
        pass  # the worker answers the parent's first request with what is missing
    from .llamacpp_worker import main

    return main(arguments)


if __name__ == "__main__":
    sys.exit(run_worker(sys.argv[1:]))
