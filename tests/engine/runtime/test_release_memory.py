"""Closing a pair gives its memory back to the system, not only to the process's C heap."""
from __future__ import annotations

import platform

import psutil
import pytest

from engine.runtime.device import release_cached_memory


def resident_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's heap")
def test_memory_freed_inside_the_heap_goes_back_to_the_system():
    before = resident_mb()
    blocks = [bytearray(100_000) for _ in range(3000)]  # ~290 MB of heap blocks (under the mmap threshold)
    kept = blocks[::100]  # a block kept every 10 MB, so glibc cannot give the freed ones back on its own
    del blocks
    freed_but_held = resident_mb()
    release_cached_memory()
    assert freed_but_held - before > 150  # free() kept them
    assert resident_mb() - before < 60  # the trim gave them back
    assert len(kept) == 30
