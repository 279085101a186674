"""What the CPU offers the runtimes: how many threads to run and which vector units it has."""
from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import psutil

# TANDEM_THREADS=N overrides the thread count: a long job (data generation) can leave a core
# to the rest of the machine, where llama.cpp's spinning threads would otherwise stall.
THREADS_VARIABLE = "TANDEM_THREADS"


def physical_cores() -> int:
    """Threads for llama.cpp: one per physical core (hyper-threads only contend), unless
    TANDEM_THREADS says otherwise."""
    chosen = os.environ.get(THREADS_VARIABLE, "")
    if chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux); empty where /proc/cpuinfo does not exist."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def repacking_crashes() -> bool:
    """On CPUs with AMX, llama.cpp repacks weights for its AMX kernels, and its first decode
    then segfaults (llama-cpp-python 0.3.36; upstream ggml-org/llama.cpp#20824): such CPUs
    load models with the plain CPU buffers."""
    return "amx_int8" in cpu_flags()


@cache
def cpu_name() -> str:
    """The processor's model name ("AMD EPYC 9R14", …)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX). Without it torch's
    bf16 matmuls are emulated: ~8× slower than fp32 on an AVX2-only EPYC (measured)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
