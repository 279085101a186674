"""llama.cpp's thread count follows the cores the rest of the machine leaves free."""
from __future__ import annotations

import os

import pytest
import torch

from engine.runtime import llamacpp, llamacpp_context, llamacpp_library
from engine.runtime.cpu import ThreadBudget, physical_cores


class Machine:
    """A fake clock and CPU-time counters: others_busy cores used by other processes, own
    by this one, advanced by `run`."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0.0, 0.0
        self.runnable = 0  # threads of other programs running or ready to run at this moment
        self.finishing = 0  # of those, threads that stop running at the next look (a peer sending its answer)

    def look_at_runnable(self) -> int:
        count = self.runnable + self.finishing
        self.finishing = 0
        return count

    def run(self, seconds: float, others_busy: float, own_busy: float) -> None:
        """`seconds` pass; programs that keep others_busy cores busy are still runnable after."""
        self.runnable = int(others_busy)
        self.now += seconds
        self.busy += seconds * (others_busy + own_busy)
        self.own += seconds * own_busy

    def budget(self, cores: int) -> ThreadBudget:
        return ThreadBudget(cores, interval=0.5, read_busy=lambda: (self.busy, self.own), clock=lambda: self.now,
                            read_runnable=self.look_at_runnable, sleep=lambda seconds: None)


def test_the_budget_leaves_the_cores_other_programs_use():
    machine = Machine()
    budget = machine.budget(cores=2)
    machine.run(1.0, others_busy=0.05, own_busy=2.0)  # quiet: our two threads, a little background
    assert budget.threads() == 2
    machine.run(1.0, others_busy=1.0, own_busy=1.0)  # another program takes a core
    assert budget.threads() == 1
    machine.run(1.0, others_busy=2.0, own_busy=0.3)  # the whole machine busy: never below one
    assert budget.threads() == 1
    machine.run(1.0, others_busy=0.0, own_busy=1.0)  # it ends: both cores again
    assert budget.threads() == 2


def test_the_budget_looks_again_only_after_its_interval():
    machine = Machine()
    budget = machine.budget(cores=4)
    machine.run(1.0, others_busy=3.0, own_busy=1.0)
    assert budget.threads() == 1
    machine.run(0.2, others_busy=0.0, own_busy=1.0)
    assert budget.threads() == 1  # too soon to tell
    machine.run(0.4, others_busy=0.0, own_busy=1.0)
    assert budget.threads() == 4


def test_after_a_pause_the_programs_running_now_decide_not_those_that_ran_meanwhile():
    machine = Machine()
    budget = machine.budget(cores=2)
    machine.run(1.0, others_busy=0.0, own_busy=2.0)
    assert budget.threads() == 2
    # A peer's turn (llama-server's row in `tandem bench`): it used both cores while we waited,
    # and is idle now. Averaged over the pause that read as two cores taken: the prompt read
    # next went on one thread.
    machine.run(3.0, others_busy=2.0, own_busy=0.01)
    machine.runnable = 0
    assert budget.threads() == 2
    # A peer still sending its answer at the first look is gone at the next.
    machine.run(3.0, others_busy=2.0, own_busy=0.01)
    machine.runnable, machine.finishing = 0, 2
    assert budget.threads() == 2
    # The same pause, but a busy program is still running when we start: its core is left.
    machine.run(3.0, others_busy=1.0, own_busy=0.01)
    machine.runnable = 1
    assert budget.threads() == 1


def test_a_long_gap_between_looks_is_a_pause_even_when_this_process_worked_in_it():
    machine = Machine()
    budget = machine.budget(cores=2)
    machine.run(0.6, others_busy=0.0, own_busy=2.0)
    assert budget.threads() == 2
    machine.run(1.0, others_busy=0.0, own_busy=2.0)  # a warm-up, then no forward while a peer runs
    machine.run(1.5, others_busy=2.0, own_busy=0.0)
    machine.runnable = 0
    assert budget.threads() == 2  # the window's average, 1.0 core elsewhere, had given one thread


def test_a_program_that_stopped_before_the_look_gives_its_cores_back_at_once():
    machine = Machine()
    budget = machine.budget(cores=2)
    machine.run(0.6, others_busy=1.0, own_busy=1.0)  # our warm-up beside a peer's
    machine.run(0.3, others_busy=2.0, own_busy=0.0)  # the peer's turn, over now
    machine.runnable = 0
    assert budget.threads() == 2  # the window, 1.3 cores elsewhere, had given one thread
    machine.run(0.6, others_busy=1.0, own_busy=1.0)  # a program that keeps its core busy
    assert budget.threads() == 1


def test_the_runnable_count_comes_from_the_kernel():
    from engine.runtime.cpu import runnable_elsewhere

    if not os.path.exists("/proc/stat"):
        assert runnable_elsewhere() is None
    else:
        assert isinstance(runnable_elsewhere(), int) and runnable_elsewhere() >= 0


@pytest.fixture(scope="module")
def f32_weights(demo_target_path):
    weights = llamacpp.load_weights(llamacpp_library.quantised_copy(demo_target_path, "fp32"), use_gpu=False)
    yield weights
    weights.close()


def test_llamacpp_decodes_on_the_threads_the_budget_allows(f32_weights, monkeypatch):
    monkeypatch.delenv("TANDEM_THREADS", raising=False)
    weights = f32_weights
    machine = Machine()
    monkeypatch.setattr(llamacpp_context, "ThreadBudget", lambda cores: machine.budget(cores=2))
    runtime = llamacpp.LlamaCppRuntime(weights, context_length=256)
    quiet = runtime.forward([1, 2, 3, 4], logits_wanted=4)  # budget not yet due: every core
    assert runtime.threads == physical_cores()
    runtime.crop(0)
    machine.run(1.0, others_busy=1.0, own_busy=1.0)
    busy = runtime.forward([1, 2, 3, 4], logits_wanted=4)
    assert runtime.threads == 1
    torch.testing.assert_close(busy, quiet, atol=3e-2, rtol=0)  # the same logits (kernels split rows by thread)
    runtime.close()


def test_a_fixed_thread_count_is_kept(f32_weights, monkeypatch):
    monkeypatch.setenv("TANDEM_THREADS", "1")
    runtime = llamacpp.LlamaCppRuntime(f32_weights, context_length=256)
    assert runtime._context._thread_budget is None and runtime.threads == 1
    runtime.close()


def test_the_native_forwards_threads_follow_the_budget_and_the_windows_thread_counts_as_others(monkeypatch):
    """The native forward's OpenMP threads meet at a barrier after every product: two threads
    with one core taken ran the demo target at 2-4 tok/s where one thread ran 140. So they
    take the budget's count, and the CPU time of a thread registered as another's work (the
    app's window) is the rest of the machine's, not the forward's."""
    import threading

    from engine.runtime import cpu

    monkeypatch.delenv("TANDEM_THREADS", raising=False)
    machine = Machine()
    window_seconds = [0.0]
    monkeypatch.setattr(cpu, "busy_seconds", lambda: (machine.busy, machine.own))
    monkeypatch.setattr(cpu, "_thread_seconds", lambda thread: window_seconds[0])
    monkeypatch.setattr(cpu, "_forward_budget", None)
    monkeypatch.setattr(cpu, "torch_threads", lambda: 2)
    monkeypatch.setattr(cpu, "_threads_of_others", set())
    torch_given = []  # torch's own ops follow the same count
    monkeypatch.setattr(cpu, "set_torch_threads", torch_given.append)
    monkeypatch.setattr(cpu, "_torch_threads_set", [0])
    real_budget = cpu.ThreadBudget
    monkeypatch.setattr(cpu, "ThreadBudget", lambda cores, read_busy: real_budget(
        cores, read_busy=read_busy, clock=lambda: machine.now, read_runnable=machine.look_at_runnable, sleep=lambda seconds: None))

    assert cpu.forward_threads() == 2
    machine.run(1.0, others_busy=0.0, own_busy=2.0)
    assert cpu.forward_threads() == 2  # quiet
    machine.run(1.0, others_busy=1.0, own_busy=1.0)
    assert cpu.forward_threads() == 1  # another process holds a core
    assert torch_given == [2, 1]
    machine.run(1.0, others_busy=0.0, own_busy=2.0)
    assert cpu.forward_threads() == 2
    assert torch_given == [2, 1, 2]
    # The window's thread busy for a whole core, inside this process: not the forward's core.
    machine.run(1.0, others_busy=0.0, own_busy=2.0)
    assert cpu.forward_threads() == 2  # not registered: it counts as the forward's own
    cpu.count_as_others(threading.get_native_id())
    window_seconds[0] += 1.0
    machine.run(1.0, others_busy=0.0, own_busy=2.0)
    machine.runnable = 1  # the window's thread, busy still: runnable_elsewhere counts it as another's
    assert cpu.forward_threads() == 1
    monkeypatch.setenv("TANDEM_THREADS", "2")
    assert cpu.forward_threads() == 2  # a fixed count is kept
    assert torch_given[-1] == 2  # and torch's own ops follow it


def test_a_held_thread_count_keeps_torchs_threads_while_the_native_kernels_follow_the_budget(monkeypatch):
    """What compiled graphs run under (compiled_forward.py): torch at the held count inside
    the block, the budget's count for the kernels called there, and torch back at the budget's
    count after it."""
    import torch

    from engine.runtime import cpu

    monkeypatch.setattr(cpu, "_torch_threads_set", [0])
    monkeypatch.setenv("TANDEM_THREADS", "1")  # the budget, with a core taken
    before = torch.get_num_threads()
    try:
        assert cpu.forward_threads() == 1 and torch.get_num_threads() == 1
        assert cpu.most_forward_threads() == 1
        with cpu.torch_threads_held(2):
            assert torch.get_num_threads() == 2
            assert cpu.forward_threads() == 1  # the native kernels' count
            assert torch.get_num_threads() == 2  # not given to torch meanwhile
        assert torch.get_num_threads() == 1
        monkeypatch.delenv("TANDEM_THREADS")
        monkeypatch.setattr(cpu, "_forward_budget", cpu.ThreadBudget(3))
        assert cpu.most_forward_threads() == 3  # the budget's ceiling, not its count now
    finally:
        torch.set_num_threads(before)


def test_a_threads_cpu_seconds_are_read_for_this_process():
    import threading
    import time

    from engine.runtime import cpu

    before = cpu._thread_seconds(threading.get_native_id())
    end = time.thread_time() + 0.2
    while time.thread_time() < end:
        pass
    assert cpu._thread_seconds(threading.get_native_id()) - before >= 0.1
    assert cpu._thread_seconds(2**31 - 1) == 0.0  # no such thread


def test_the_native_forward_gives_the_same_logits_on_one_thread_as_on_two(monkeypatch):
    from engine.runtime import native_forward
    from engine.runtime.int8_weights import quantise_weight_only
    from engine.runtime.torch_static import StaticTorchRuntime

    from ..tiny_models import tiny_llama

    model = quantise_weight_only(tiny_llama(seed=2, vocab_size=64, hidden=64))
    ids = [5, 9, 11, 40, 2, 7, 33, 12]
    results = []
    for threads in (1, 2):
        monkeypatch.setattr(native_forward, "forward_threads", lambda: threads)
        runtime = StaticTorchRuntime(model, torch.device("cpu"), 200, graphs=False)
        if runtime.native is None:
            pytest.skip(f"the native forward does not run here: {runtime.name}")
        results.append(runtime.forward(ids, logits_wanted=8))
    assert torch.equal(*results)
