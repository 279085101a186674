"""llama.cpp's thread count follows the cores the rest of the machine leaves free."""
from __future__ import annotations

import pytest
import torch

from engine.runtime import llamacpp, llamacpp_context, llamacpp_library
from engine.runtime.cpu import ThreadBudget, physical_cores


class Machine:
    """A fake clock and CPU-time counters: others_busy cores used by other processes, own
    by this one, advanced by `run`."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0.0, 0.0

    def run(self, seconds: float, others_busy: float, own_busy: float) -> None:
        self.now += seconds
        self.busy += seconds * (others_busy + own_busy)
        self.own += seconds * own_busy

    def budget(self, cores: int) -> ThreadBudget:
        return ThreadBudget(cores, interval=0.5, read_busy=lambda: (self.busy, self.own), clock=lambda: self.now)


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
