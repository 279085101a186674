"""The C heap (glibc's malloc), which holds what torch, llama.cpp and the tokenizers allocate.

glibc gives each thread that allocates under contention an arena of its own, up to eight per
core, and keeps the freed blocks of each arena for reuse. Loading and closing model pairs
from the engine thread while llama.cpp's threads and Qt's allocate elsewhere scatters those
blocks over many arenas, so resident memory creeps up with every switch of pairs (`tandem
soak`). Two arenas hold the same work with no measured loss of speed, and after a reply or a
pair's close the free pages go back to the system.

On other C libraries (macOS, Windows, musl) these calls do nothing (and the heap's own
account is unknown): their allocators return memory on their own.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from functools import cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
ARENAS = 2  # the main thread's arena and one the other threads share
# While a pair loads, every block over 128 KB (glibc's starting threshold) gets pages of its
# own, which go back to the system whole when the pair closes instead of leaving holes
# between the blocks that outlive it. While replies run, blocks up to 32 MB (a tree's logits)
# come from the heap and are reused round after round, as glibc's own adaptive threshold
# would settle; free pages stay until the trim after each reply, not given back and
# faulted in again every round.
LOADING_MMAP_THRESHOLD = 128 * 1024
RUNNING_MMAP_THRESHOLD = 32 * 1024 * 1024
RUNNING_TRIM_THRESHOLD = 64 * 1024 * 1024


class MallInfo2(ctypes.Structure):
    """glibc's mallinfo2 (2.33 and later): the heap's own account of its blocks, in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


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
    (arenas made before the call stay). True where the cap took effect; a MALLOC_ARENA_MAX
    the user set is left to glibc."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, ARENAS))


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around a pair's load: what it allocates is mapped on its own (see above)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, LOADING_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, RUNNING_MMAP_THRESHOLD)
            libc.mallopt(M_TRIM_THRESHOLD, RUNNING_TRIM_THRESHOLD)


def trim() -> None:
    """Give the heap's free pages back to the system (malloc_trim; under a millisecond). A
    reply's rounds free tens of MB of logits that glibc would otherwise keep."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def in_use_bytes() -> int | None:
    """What the C heap has handed out and not had back: the blocks in use in its arenas and
    those mapped on their own. Resident memory also counts the free blocks glibc keeps between
    live ones, which settle ~15 MB over a soak's first ~100 replies (its pair switches) while
    this grows ~1 MB per 100, in bounded caches (docs/BENCHMARKS.md); a leak raises both. None
    where glibc's mallinfo2 (2.33 and later) is missing."""
    mallinfo2 = getattr(_glibc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd
