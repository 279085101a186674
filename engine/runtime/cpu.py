"""What the CPU offers the runtimes: how many threads to run and which vector units it has."""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import psutil

# TANDEM_THREADS=N overrides the thread count: a long job (data generation) can leave a core
# to the rest of the machine, where llama.cpp's spinning threads would otherwise stall.
THREADS_VARIABLE = "TANDEM_THREADS"


def physical_cores() -> int:
    """Threads for llama.cpp: one per physical core (hyper-threads only contend), unless
    TANDEM_THREADS says otherwise."""
    return chosen_threads() or psutil.cpu_count(logical=False) or os.cpu_count() or 1


def chosen_threads() -> int | None:
    """The thread count TANDEM_THREADS fixes, or None."""
    chosen = os.environ.get(THREADS_VARIABLE, "")
    return int(chosen) if chosen.isdigit() and int(chosen) > 0 else None


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process has run, CPU seconds this process has run), since boot and
    since start: the two clocks ThreadBudget compares."""
    machine = psutil.cpu_times()
    busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
    own = psutil.Process().cpu_times()
    return busy, own.user + own.system


def runnable_elsewhere() -> int | None:
    """Threads of other programs running or ready to run at this moment: /proc/stat's
    procs_running less this process's own (the one asking, and any of its workers not yet
    asleep after their last forward), the threads `count_as_others` named counted as others.
    None where there is no /proc/stat."""
    try:
        running = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                       if line.startswith("procs_running"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    own = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        own += state == "R" and int(task.name) not in _threads_of_others
    return max(0, running - own)


class ThreadBudget:
    """How many threads llama.cpp should run now: the cores the rest of the machine leaves free.

    llama.cpp's threads meet at a spinning barrier after every operation of a forward, so
    one thread descheduled by another program stalls all of them: with two threads on a
    2-core CPU and one busy process beside them, a step that takes 10 ms quiet took
    hundreds of ms, with stalls of seconds (issue 23). One thread fewer than the free
    cores never waits on a barrier for a core it cannot have. So every `interval` seconds
    the budget reads how much CPU the other processes used since the last look, and allows
    the cores left (at least one, at most `cores`).

    Except after a pause of this process (no look for STALE_INTERVALS intervals, or less than
    IDLE_CORES of a core used since the last: between two replies, or while a peer's row ran in
    `tandem bench`): what ran while it waited says little about now, and the first look after a
    pause is the one a prompt is read under, in one long call. The threads of other programs
    runnable at this moment decide it instead. And a window that says cores are taken is
    checked against that count too: a program that has stopped since (a peer's turn that ended
    just before ours) gives its cores back at once, where one that keeps a core busy is
    runnable whenever this process's threads wait between forwards. The count is the fewest of
    a few looks a few milliseconds apart, as a peer that has just answered (llama-server
    sending its reply) is still running for a moment.
    (Beside llama-server's rows, each of Tandem's prompts had been read on one thread because
    the server had used both cores before it: the 1.7B shape's `ar` wrote 11.9 tok/s beside
    the server where it wrote 15.5 with its threads fixed.)"""

    IDLE_CORES = 0.25
    STALE_INTERVALS = 3  # while a reply runs, its forwards look every interval or so
    RUNNABLE_LOOKS, RUNNABLE_LOOK_GAP_S = 3, 0.002  # ~4 ms a look while a core is taken, every interval

    def __init__(
        self, cores: int, interval: float = 0.5,
        read_busy: Callable[[], tuple[float, float]] = busy_seconds, clock: Callable[[], float] = time.monotonic,
        read_runnable: Callable[[], int | None] = runnable_elsewhere, sleep: Callable[[float], None] = time.sleep,
    ):
        self.cores = cores
        self.interval = interval
        self._read_busy = read_busy
        self._read_runnable = read_runnable
        self._sleep = sleep
        self._clock = clock
        self._last = (clock(), *read_busy())
        self._threads = cores

    def threads(self) -> int:
        now = self._clock()
        last_time, last_busy, last_own = self._last
        if now - last_time < self.interval:
            return self._threads
        busy, own = self._read_busy()
        self._last = (now, busy, own)
        elapsed = now - last_time
        others = max(0.0, (busy - last_busy) - (own - last_own)) / elapsed  # cores in use elsewhere
        paused = elapsed > self.STALE_INTERVALS * self.interval or (own - last_own) / elapsed < self.IDLE_CORES
        if paused or self._taken(others):
            running_now = self._runnable_now()
            if running_now is not None:
                others = float(running_now) if paused else min(others, float(running_now))
        self._threads = max(1, min(self.cores, self.cores - self._taken(others)))
        return self._threads

    @staticmethod
    def _taken(others: float) -> int:
        """Cores counted as taken: rounded with a margin, so that a desktop's background flicker keeps every core."""
        return int(others + 0.3)

    def _runnable_now(self) -> int | None:
        fewest = None
        for look in range(self.RUNNABLE_LOOKS):
            if look:
                self._sleep(self.RUNNABLE_LOOK_GAP_S)
            count = self._read_runnable()
            if count is None or count == 0:
                return count
            fewest = count if fewest is None else min(fewest, count)
        return fewest


# Threads of this process whose work is not the forwards' (the window's own thread): their CPU
# time counts as the rest of the machine's in the forwards' budget, since a core they use is a
# core a forward's thread would wait for at a barrier.
_threads_of_others: set[int] = set()
_forward_budget: ThreadBudget | None = None


def count_as_others(native_thread_id: int) -> None:
    """Count this thread's CPU time as taken from the forwards (the app registers its window's thread)."""
    _threads_of_others.add(native_thread_id)


def forward_threads() -> int:
    """Threads for the native forward and the int8 kernel now: TANDEM_THREADS where set, else
    as many of torch's threads as the budget of free cores allows. Their OpenMP threads meet
    at a barrier after every product, as llama.cpp's do, and fall to a fraction of their speed
    when one of them waits for a core that another process holds (measured in
    docs/BENCHMARKS.md): the budget gives that core up instead."""
    global _forward_budget
    threads = chosen_threads()
    if threads is None:
        if _forward_budget is None:
            _forward_budget = ThreadBudget(torch_threads(), read_busy=busy_seconds_with_others)
        threads = _forward_budget.threads()
    if threads != _torch_threads_set[0] and not getattr(_held, "threads", None):
        # torch's own ops between the forwards (sampling over the vocabulary, the drafts' glue)
        # run on the same OpenMP threads: a 2-thread softmax stalled on the taken core as the
        # forward did (one busy process: 46 tok/s with the forward on one thread, torch on two).
        # A count TANDEM_THREADS fixes holds for them too (with one forward thread, torch's
        # second thread had spun at every op's barrier: a third of a long prompt's CPU samples).
        set_torch_threads(threads)
        _torch_threads_set[0] = threads
    return threads


_torch_threads_set = [0]  # the count forward_threads last gave torch (0: none yet)
# torch's thread count is each thread's own (OpenMP's): a hold is this thread's too.
_held = threading.local()  # .threads: the count torch_threads_held keeps on this thread


def most_forward_threads() -> int:
    """The most threads forward_threads gives: TANDEM_THREADS where set, else the budget's
    cores (torch's own count before the budget first changed it)."""
    chosen = chosen_threads()
    if chosen is not None:
        return chosen
    return _forward_budget.cores if _forward_budget is not None else torch_threads()


@contextlib.contextmanager
def torch_threads_held(threads: int) -> Iterator[None]:
    """torch's own ops run on `threads` threads inside the block, whatever the budget chooses
    meanwhile (the native kernels called inside still follow the budget: they take their count
    as an argument).

    For torch.compile's graphs: dynamo guards each graph on the thread count it was compiled
    at, and where the count differs it runs the forward eagerly, whose last bits are not the
    graphs'. A reply whose budget changed mid-way then verified with one forward and stepped
    with the other (docs/bench/compiled_threads_bits.py)."""
    held_before, count_before = getattr(_held, "threads", None), torch_threads()
    if threads != count_before:
        set_torch_threads(threads)
    _held.threads = threads
    try:
        yield
    finally:
        _held.threads = held_before
        if threads != count_before:
            set_torch_threads(count_before)  # what forward_threads last set, which it remembers


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def busy_seconds_with_others() -> tuple[float, float]:
    """busy_seconds, with the CPU time of the threads `count_as_others` named moved from this
    process's own seconds to the rest of the machine's."""
    busy, own = busy_seconds()
    return busy, own - sum(_thread_seconds(thread) for thread in _threads_of_others)


def _thread_seconds(native_thread_id: int) -> float:
    """CPU seconds one thread of this process has run (0 where it is gone or unknown)."""
    try:
        fields = Path(f"/proc/self/task/{native_thread_id}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
