"""The static forward compiled by torch.compile in the background (engine/runtime/compiled_forward.py).

Every compile here is real (inductor generates and builds C++), on tiny random models of
every family the static runtime covers: 20-40 s each on two cores. The reference is the
eager model, as in test_static_families.py, through the same prompts, trees, kept paths,
chains and crops.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM

from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.runtime import compiled_forward
from engine.runtime.forward_plan import ForwardSettings, plan_forward
from engine.runtime.torch_load import torch_runtime_factory
from engine.runtime.torch_static import StaticTorchRuntime

from .test_static_families import FAMILIES, SHAPE, tiny
from .test_static_families import test_static_logits_equal_the_eager_ones_through_prompts_trees_kept_paths_and_chains as check_static_runtime
from .test_torch_static import tiny_pair

COMPILE_TIMEOUT_S = 600


def compiled(model: torch.nn.Module, capacity: int = 400, native: bool = True) -> StaticTorchRuntime:
    """A static runtime over `model` whose background compile has ended, and succeeded."""
    runtime = StaticTorchRuntime(model, torch.device("cpu"), capacity, graphs=False, compile=True, native=native)
    assert runtime.background_note == "compiling in the background"
    runtime.start_background_work()
    assert runtime.compiler.wait(COMPILE_TIMEOUT_S)
    assert runtime.background_note == "compiled", runtime.background_note
    return runtime


class CompiledOnly:
    """Stands in for the runtime's compiled function and fails the test when a call runs
    anything but a compiled graph: dynamo's run-only mode would quietly run a shape whose
    guards miss eagerly, and that would pass every logits check."""

    def __init__(self, compiled_function):
        self.compiled_function = compiled_function
        self.calls = 0

    def __call__(self, *arguments):
        with torch.profiler.profile() as profile:
            result = self.compiled_function(*arguments)
        names = {event.name for event in profile.events()}
        assert any(name.startswith("Torch-Compiled Region") for name in names), "the forward ran uncompiled"
        assert "aten::index_copy_" not in names, "part of the forward ran eagerly"  # the cache write
        self.calls += 1
        return result


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_logits_equal_the_eager_ones_through_prompts_trees_kept_paths_and_chains(monkeypatch, family):
    """The whole static-runtime check of test_static_families, run on the compiled forward
    (and only there: the eager forward is taken away)."""
    model = tiny(family)
    runtime = compiled(model)
    counting = CompiledOnly(runtime.compiler._compiled)
    runtime.compiler._compiled = counting
    monkeypatch.setattr(runtime, "_forward", lambda *_: pytest.fail("an eager forward ran after the compile"))
    monkeypatch.setattr(sys.modules[check_static_runtime.__module__], "static", lambda _model: runtime)
    check_static_runtime(family)
    assert counting.calls >= 12  # the check's forwards: a chunked prompt, trees, chains, crops


def test_replies_run_eagerly_while_the_compile_runs_and_give_the_same_tokens(make_word_tokenizer):
    """A pair chats at once; a reply before the compile ends and one after give the same greedy tokens."""
    model = tiny("qwen3", seed=5)
    pair = tiny_pair(make_word_tokenizer, lambda m: StaticTorchRuntime(m, torch.device("cpu"), 200, graphs=False, compile=True), model=model)
    compiler = pair.target_runner.compiler
    settings = DecodeSettings(method="chain", max_new_tokens=30)
    before = list(pair.generate([Message("user", "w1 w2 w3")], settings))[-1].token_ids
    assert not compiler.finished  # never started: the reply ran eagerly
    # The draft here is a second cache of the same model: one compile, one label for both.
    assert pair.runtime_label == "torch, compiling in the background"
    pair.wait_for_background_work()
    assert pair.runtime_label == "torch, compiled"
    counting = CompiledOnly(compiler._compiled)
    compiler._compiled = counting
    pair.reset_caches()
    after = list(pair.generate([Message("user", "w1 w2 w3")], settings))[-1].token_ids
    assert counting.calls > 0
    assert after == before


def test_a_second_runtime_over_the_same_model_shares_the_compile():
    model = tiny("mistral", seed=2)
    first = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    second = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    other_size = StaticTorchRuntime(model, torch.device("cpu"), 600, graphs=False, compile=True)
    assert first.compiler is second.compiler
    assert other_size.compiler is not first.compiler  # its widest key window is another shape


def test_a_failed_compile_keeps_the_eager_forward_and_says_why(monkeypatch):
    """The compiler backend fails (as it does where no C++ compiler is installed): the reason
    is kept and shown, and the runtime gives the eager logits."""
    from torch._inductor import compile_fx

    def no_compiler(*_arguments, **_keywords):
        raise RuntimeError("Failed to find a working C++ compiler. Tried: ('g++',)\nmore lines of detail")

    monkeypatch.setattr(compile_fx, "compile_fx", no_compiler)
    switching = sys.getswitchinterval()
    # One layer: a graph no other test compiled, so this one has to be compiled afresh.
    torch.manual_seed(7)
    model = Phi3ForCausalLM(Phi3Config(**{**SHAPE, "num_hidden_layers": 1}, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    runtime = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    runtime.start_background_work()
    assert runtime.compiler.wait(COMPILE_TIMEOUT_S)
    assert runtime.background_note == "not compiled: RuntimeError: Failed to find a working C++ compiler. Tried: ('g++',)"
    assert sys.getswitchinterval() == switching  # shortened for the compile only
    assert runtime.compiler.compiled_for((1, 256)) is None
    reference = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False)
    context = list(range(3, 40))
    torch.testing.assert_close(runtime.forward(context, 5), reference.forward(context, 5), rtol=0, atol=0)


COMPILE_IN_A_FRESH_PROCESS = """
import json, sys, torch
sys.path.insert(0, {root!r})
from tests.engine.runtime.test_static_families import tiny
from engine.runtime.torch_static import StaticTorchRuntime
model = tiny("qwen2", seed=11)
runtime = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, compile=True)
runtime.start_background_work()
runtime.compiler.wait()
context = list(range(3, 40))
print(json.dumps({{"note": runtime.background_note, "logits": runtime.forward(context, 3).tolist()}}))
"""


def run_compile_in_a_fresh_process(cache: Path) -> dict:
    root = str(Path(__file__).resolve().parents[3])
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    finished = subprocess.run(
        [sys.executable, "-c", COMPILE_IN_A_FRESH_PROCESS.format(root=root)],
        capture_output=True, text=True, env=environment, timeout=COMPILE_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


def test_a_corrupt_compile_cache_is_rebuilt_not_fatal(tmp_path):
    cache = tmp_path / "inductor"
    # From a copy of this session's kernel cache: the qwen2 test above compiled the same graphs
    # (another seed, the same shapes), so the first compile here reads them back in seconds
    # instead of a minute and a half; run alone, this test compiles them twice.
    session_cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    if session_cache.is_dir():
        shutil.copytree(session_cache, cache)
    first = run_compile_in_a_fresh_process(cache)
    assert first["note"] == "compiled"
    written = [path for path in cache.rglob("*") if path.is_file()]
    assert written  # the compiled kernels were kept on disk
    for path in written:
        path.write_bytes(b"not what was written here")
    second = run_compile_in_a_fresh_process(cache)
    assert second["note"] == "compiled"
    torch.testing.assert_close(torch.tensor(second["logits"]), torch.tensor(first["logits"]))
    assert any(path.read_bytes() != b"not what was written here" for path in cache.rglob("*") if path.is_file())


def test_compiling_follows_the_pairs_setting_and_tandem_compile(monkeypatch):
    model = tiny("gemma3", seed=4)
    cpu = torch.device("cpu")

    def planned(compile: bool):
        plan = plan_forward(model, cpu, ForwardSettings.for_pair(compile))
        return plan.name, torch_runtime_factory(model, cpu, 100, plan)(False, ())

    monkeypatch.setenv(compiled_forward.COMPILE_ENVIRONMENT, "1")
    name, runtime = planned(compile=True)
    assert name == "torch (static cache)" and isinstance(runtime, StaticTorchRuntime) and runtime.compiler is not None
    name, runtime = planned(compile=False)
    assert name == "torch" and not isinstance(runtime, StaticTorchRuntime)
    monkeypatch.setenv(compiled_forward.COMPILE_ENVIRONMENT, "0")
    name, runtime = planned(compile=True)
    assert name == "torch" and not isinstance(runtime, StaticTorchRuntime)


def test_compiled_kernels_are_kept_in_tandems_cache_unless_the_user_chose_a_folder(monkeypatch, tmp_path):
    from engine import paths

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    paths.keep_compiled_kernels()
    kept = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert kept.parent == tmp_path / "cache" / "compiled" and kept.name == f"torch-{torch.__version__}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    paths.keep_compiled_kernels()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_tandem_chat_says_when_the_compile_has_ended_and_measures_again(make_word_tokenizer, monkeypatch):
    """The chat's first reply runs while the forward compiles; the next one starts by
    measuring the tree costs again (on the chat's thread) and saying what runs it now."""
    import io

    from engine.terminal_chat import TerminalChat

    pair = tiny_pair(make_word_tokenizer, lambda m: StaticTorchRuntime(m, torch.device("cpu"), 200, graphs=False, compile=True),
                     model=tiny("qwen3", seed=6))
    measured_again = []
    monkeypatch.setattr(pair, "after_background_work", lambda: measured_again.append(True))
    out = io.StringIO()

    def read(_prompt, lines=iter(["w1 w2", "w3 w4", "/quit"])):
        line = next(lines)
        if line == "w3 w4":  # between the replies: the compile ends
            pair.start_background_work()
            assert pair.target_runner.compiler.wait(COMPILE_TIMEOUT_S)
        return line

    chat = TerminalChat(pair, DecodeSettings(method="chain", max_new_tokens=8), None, read=read, out=out)
    assert chat.run() == 0
    printed = out.getvalue()
    assert "torch, compiling in the background" in printed.splitlines()[0]  # the header
    assert printed.count("[runtime: torch, compiled]") == 1 and measured_again == [True]
    assert printed.index("[runtime: torch, compiled]") > printed.index("tandem>")  # after the first reply


def test_llama_compiled_gives_the_eager_logits_through_a_prompt_a_tree_and_a_chain():
    """Llama, the family the static runtime began with (test_torch_static.py), compiled."""
    import random

    from engine.tree import forward_tree

    from ..tiny_models import tiny_llama
    from .test_static_families import VOCAB, assert_same, deep_tree, eager_logits

    model = tiny_llama(seed=8, vocab_size=VOCAB)
    runtime = compiled(model)
    runtime.compiler._compiled = CompiledOnly(runtime.compiler._compiled)
    rng = random.Random(8)
    context = [rng.randrange(VOCAB) for _ in range(150)]  # three chunks
    assert_same(runtime.forward(context, logits_wanted=70), eager_logits(model, context, 70))
    tree = deep_tree(rng, context[-1], 20)
    logits = forward_tree(runtime, context, tree)
    for node in range(len(tree)):
        assert_same(logits[node : node + 1], eager_logits(model, context + [tree.tokens[step] for step in tree.path(node)]))
    assert runtime.compiler._compiled.calls >= 4


def test_int8_compiled_keeps_the_eager_logits_and_gives_a_verify_the_steps_logits_to_the_bit(monkeypatch):
    """The CPU default precision, compiled: its integer matmuls (int8_weights.py) run inside
    the compiled graphs, and a k-token verify still gives each token the logits one-token
    steps give it, as in the eager forward (test_int8_weights.py). Also when the thread budget
    has changed between them (a busy machine): dynamo guards the graphs on torch's thread
    count, and had run the steps eagerly, with other last bits."""
    from engine.runtime.int8_weights import quantise_weight_only

    from ..tiny_models import tiny_llama
    from .test_static_families import VOCAB

    model = quantise_weight_only(tiny_llama(seed=9, vocab_size=VOCAB, hidden=64))
    ids = [5, 9, 11, 40, 2, 7, 33, 12, 3, 8, 17, 21]
    monkeypatch.setenv("TANDEM_THREADS", "2")
    verifying = compiled(model, native=False)  # the compiled graphs, not the native forward
    verifying.compiler._compiled = CompiledOnly(verifying.compiler._compiled)
    verified = verifying.forward(ids, logits_wanted=10)
    monkeypatch.setenv("TANDEM_THREADS", "1")  # what the budget gives when one core is taken
    stepping = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, compile=True, native=False)
    assert stepping.compiler is verifying.compiler  # the same compiled graphs, another cache
    stepping.forward(ids[:2], logits_wanted=1)
    stepped = torch.cat([stepping.forward([token], logits_wanted=1) for token in ids[2:]])
    assert verifying.compiler.failure is None  # CompiledOnly raises (and the compile is given up) on an eager run
    assert verifying.compiler._compiled.calls == 1 + len(ids) - 1
    assert torch.equal(verified, stepped)
    uncompiled = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, native=False).forward(ids, logits_wanted=10)
    # A last-bit difference in attention can move an activation across a rounding step.
    assert (verified - uncompiled).abs().max() <= 1e-3 * uncompiled.abs().max()
    assert torch.equal(verified.argmax(-1), uncompiled.argmax(-1))


def test_closing_the_last_runtime_stops_its_compile_and_lets_the_model_go():
    import gc
    import weakref as weak

    model = tiny("qwen2", seed=12)
    model_alive = weak.ref(model)
    first = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    second = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    compiler = first.compiler
    first.start_background_work()
    first.close()
    assert not compiler.cancelled  # the second runtime still uses it
    second.close()
    assert compiler.cancelled
    assert compiler.wait(COMPILE_TIMEOUT_S)
    assert compiler.note.startswith("not compiled: stopped")
    # A runtime opened later compiles afresh rather than inherit the stopped compile.
    third = StaticTorchRuntime(model, torch.device("cpu"), 300, graphs=False, compile=True)
    assert third.compiler is not compiler and not third.compiler.cancelled
    # A compile that never started holds nothing: the model goes with its runtimes.
    del first, second, third, compiler, model
    gc.collect()
    assert model_alive() is None


def test_overlapping_compiles_give_the_switch_interval_back_once_both_ended():
    """The target's and the draft's compiles overlap; Python's switch interval is short while
    either runs and back to what it was once both have ended, whichever ends first."""
    from engine.runtime.compiled_forward import COMPILE_SWITCH_INTERVAL_S, _quick_gil_handover

    before = sys.getswitchinterval()
    first, second = _quick_gil_handover(), _quick_gil_handover()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL_S)  # the second still runs
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
