"""The C heap (glibc's malloc), which holds what torch, llama.cpp and the tokenizers allocate.

glibc gives each thread that allocates under contention an arena of its own, up to eight per
core, and keeps the freed blocks of each arena for reuse. Loading and closing model pairs
from the engine thread while llama.cpp's threads and Qt's allocate elsewhere scatters those
blocks over many arenas, so resident memory creeps up with every switch of pairs (`tandem
soak`). Two arenas hold the same work with no measured loss of speed, and after a reply or a
pair's close the free pages go back to the system.

On other C libraries (macOS, Windows, musl) both calls do nothing: their allocators return
memory on their own.
"""
from __future__ import annotations

import ctypes
from functools import cache

M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2  # the main thread's arena and one the other threads share


@cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # both glibc's; absent elsewhere
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def limit_arenas() -> bool:
    """Cap the number of arenas; call it first thing, before other threads start allocating
    (arenas made before the call stay). True where the cap took effect."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, ARENAS))


def trim() -> None:
    """Give the heap's free pages back to the system (malloc_trim; under a millisecond). A
    reply's rounds free tens of MB of logits that glibc would otherwise keep."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
