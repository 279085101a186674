"""Closing a pair gives its memory back to the system, not only to the process's C heap."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runtime.device import release_cached_memory

ROOT = Path(__file__).resolve().parents[3]
GLIBC_ONLY = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's heap")


def in_a_fresh_process(script: str, *args: str) -> str:
    """What `script` prints, run by a new interpreter: a test worker's heap already holds free
    blocks and arenas from earlier tests."""
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


HEAP_TRIM = """
import psutil
from engine.runtime.device import release_cached_memory

def resident_mb():
    return psutil.Process().memory_info().rss / 2**20

before = resident_mb()
blocks = [bytearray(100_000) for _ in range(3000)]  # ~290 MB of heap blocks (under the mmap threshold)
kept = blocks[::100]  # a block kept every 10 MB, so glibc cannot give the freed ones back on its own
del blocks
freed_but_held = resident_mb()
release_cached_memory()
print(len(kept), freed_but_held - before, resident_mb() - before)
"""


@GLIBC_ONLY
def test_memory_freed_inside_the_heap_goes_back_to_the_system():
    """In a fresh process: a test worker's heap already holds free blocks from earlier tests,
    which the new blocks would reuse without growing the resident size (CI saw +115 MB, not +290)."""
    output = in_a_fresh_process(HEAP_TRIM)
    kept, held_mb, after_trim_mb = output.split()
    assert kept == "30"
    assert float(held_mb) > 150  # free() kept them
    assert float(after_trim_mb) < 60  # the trim gave them back


ARENA_COUNT = """
import ctypes, re, sys, tempfile, threading
from engine import heap
capped = heap.limit_arenas() if sys.argv[1] == "capped" else False

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def allocate():  # ctypes lets go of the GIL in each call, so the threads malloc at once
    for _ in range(20000):
        libc.free(libc.malloc(4096))

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile() as report:
    stream = libc.fdopen(libc.dup(report.fileno()), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    report.seek(0)
    print(capped, len(re.findall(rb"<heap nr=", report.read())))
"""


def arenas_after_threads(capped: bool) -> tuple[str, int]:
    """(whether the cap took, arenas) in a fresh process whose 8 threads allocate at once."""
    output = in_a_fresh_process(ARENA_COUNT, "capped" if capped else "free").split()
    return output[0], int(output[1])


@GLIBC_ONLY
def test_threads_share_the_capped_arenas_after_limit_arenas():
    """Threads that allocate at once each get an arena of their own (which scattered a pair's
    freed blocks over many arenas); after the cap they share heap.ARENAS. glibc's own report
    (malloc_info) counts them."""
    from engine import heap

    took, capped = arenas_after_threads(capped=True)
    _, free = arenas_after_threads(capped=False)
    assert took == "True"
    assert 1 <= capped <= heap.ARENAS < free


MAPPED_BLOCKS = """
import ctypes
from engine import heap

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.mallinfo2.restype = heap.MallInfo2
mapped = lambda: libc.mallinfo2().hblks
with heap.loading():
    before = mapped()
    during = libc.malloc(1 << 20)
    print(mapped() - before)
before = mapped()
after = libc.malloc(1 << 20)
print(mapped() - before)
"""


@GLIBC_ONLY
def test_a_pair_loads_into_blocks_of_their_own_and_replies_run_in_the_heap():
    """A 1 MB block allocated while a pair loads is mapped on its own (it goes back whole when
    the pair closes); one allocated afterwards, as a round's logits are, comes from the heap."""
    output = in_a_fresh_process(MAPPED_BLOCKS)
    assert output.split() == ["1", "0"]


HELD_BUT_FREE = """
import psutil
from engine import heap

def resident_mb():
    return psutil.Process().memory_info().rss / 2**20

def in_use_mb():
    return heap.in_use_bytes() / 2**20

resident, in_use = resident_mb(), in_use_mb()
blocks = [bytearray(100_000) for _ in range(3000)]  # ~290 MB of heap blocks (under the mmap threshold)
grown = in_use_mb() - in_use
kept = blocks[::100]  # a block kept every 10 MB, so glibc keeps the freed ones between them
del blocks
print(len(kept), grown, resident_mb() - resident, in_use_mb() - in_use)
"""


@GLIBC_ONLY
def test_the_heap_in_use_counts_live_blocks_not_the_free_ones_glibc_keeps():
    """What `tandem soak` reports beside resident memory, to tell a leak from glibc's keeping:
    freed blocks held between live ones stay resident but leave the heap's count in use."""
    output = in_a_fresh_process(HELD_BUT_FREE)
    kept, grown_mb, resident_mb, in_use_mb = output.split()
    assert kept == "30"
    assert float(grown_mb) > 250  # the live blocks counted
    assert float(resident_mb) > 150  # the freed ones still resident
    assert float(in_use_mb) < 10  # but no longer in use: the 30 kept are ~3 MB


def test_the_heap_in_use_is_unknown_without_glibcs_mallinfo2(monkeypatch):
    from engine import heap

    monkeypatch.setattr(heap, "_glibc", lambda: None)
    assert heap.in_use_bytes() is None


def test_an_arena_cap_the_user_set_is_left_to_glibc(monkeypatch):
    from engine import heap

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert heap.limit_arenas() is False
