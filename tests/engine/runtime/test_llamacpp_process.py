"""llama.cpp in a worker process (llamacpp_process): the same runtime as in this process, on
the same F32 demo GGUF, bit for bit; a worker that never loads torch's libraries; and
failures (a bad file, a full cache, a worker that dies) that are clear errors, never hangs."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.config import DecodeSettings
from engine.errors import ModelLoadError, OutOfMemoryError
from engine.runtime import llamacpp_library, llamacpp_process

# Found, not imported: importing llama_cpp loads its libraries, which a GPU build must not
# do beside CUDA torch.
pytestmark = pytest.mark.skipif(not llamacpp_library.available(), reason="needs llama-cpp-python")
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights
from engine.runtime.peers import LlamaCppGeneration

LAYERS = (1, 14, 27)
# Where llama.cpp has GPU libraries of its own, it must not load in this process (the reason
# for workers): the comparisons with an in-process runtime skip there.
IN_PROCESS_IS_SAFE = not llamacpp_process.gpu_build()


@pytest.fixture(scope="module")
def f32_path(demo_target_path) -> Path:
    """The demo target as F32, converted by a worker (so also where this process must not)."""
    weights = llamacpp_process.load_weights(demo_target_path, "fp32", use_gpu=False)
    weights.close()
    return weights.path


@pytest.fixture(scope="module")
def both_weights(f32_path):
    if not IN_PROCESS_IS_SAFE:
        pytest.skip("llama.cpp's GPU build cannot load beside CUDA torch")
    here = load_weights(f32_path, use_gpu=False)
    worker = llamacpp_process.load_weights(f32_path, "stored", use_gpu=False)
    yield here, worker
    here.close()
    worker.close()


def run_the_same_calls(runtime: LlamaCppRuntime, seed: int) -> list[torch.Tensor]:
    """Prompt, tree, kept path, crop, step: every call the algorithms make, with its outputs."""
    rng = random.Random(seed)
    # 12 rows of logits outgrow the shared file's first size (1 MiB): it grows midway.
    outputs = [runtime.forward([rng.randrange(200, 40000) for _ in range(30)], logits_wanted=12)]
    start = len(runtime)
    parents = [start - 1, start, start - 1, start + 2, start + 1]
    outputs.append(runtime.forward_tree([rng.randrange(200, 40000) for _ in parents], parents, len(parents)))
    runtime.keep_slots(start, [start + 2, start + 3])
    outputs.append(runtime.forward([rng.randrange(200, 40000)]))
    runtime.crop(start - 4)
    outputs.append(runtime.forward([rng.randrange(200, 40000) for _ in range(3)], logits_wanted=2))
    if runtime.returns_hidden:
        outputs.append(runtime.last_hidden_states())
    if runtime.feature_layers:
        outputs.append(runtime.features)
    return outputs


@pytest.mark.parametrize("kind", ["plain", "hidden states", "features"])
def test_a_worker_runtime_gives_what_the_runtime_here_gives_bit_for_bit(both_weights, kind):
    options = {"plain": {}, "hidden states": {"hidden_states": True}, "features": {"feature_layers": LAYERS}}[kind]
    here_weights, worker_weights = both_weights
    assert (worker_weights.vocab_size, worker_weights.hidden_size, worker_weights.file_type) == (
        here_weights.vocab_size, here_weights.hidden_size, here_weights.file_type
    )
    here = LlamaCppRuntime(here_weights, 256, threads=1, **options)
    there = LlamaCppRuntime(worker_weights, 256, threads=1, **options)
    try:
        for expected, got in zip(run_the_same_calls(here, seed=3), run_the_same_calls(there, seed=3), strict=True):
            assert got.shape == expected.shape
            assert torch.equal(got, expected)
        assert there.cached_ids == here.cached_ids
    finally:
        here.close()
        there.close()


def test_the_worker_never_loads_torch_and_runs_llamacpp(both_weights, tmp_path):
    """The point of the worker: llama.cpp's libraries without torch's, in one process."""
    maps = Path(f"/proc/{both_weights[1].worker._process.pid}/maps")
    if not maps.exists():
        pytest.skip("needs /proc to read which libraries a process has loaded")
    libraries = {Path(line.split()[-1]).name for line in maps.read_text().splitlines() if ".so" in line}
    assert any(name.startswith("libllama") for name in libraries), sorted(libraries)
    assert not any("torch" in name or name.startswith("libc10") for name in libraries), sorted(libraries)


def test_a_corrupt_file_is_a_clear_error_and_leaves_no_worker(f32_path, tmp_path):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(f32_path.read_bytes()[: 1 << 20])
    before = set(_worker_pids())
    with pytest.raises(ModelLoadError, match="corrupt.gguf"):
        llamacpp_process.load_weights(corrupt, "stored", use_gpu=False)
    assert set(_worker_pids()) == before


def test_a_full_cache_is_an_error_and_the_worker_serves_on(both_weights):
    runtime = LlamaCppRuntime(both_weights[1], 256, threads=1)
    try:
        with pytest.raises((OutOfMemoryError, ModelLoadError, ValueError)):
            runtime.forward(list(range(300, 900)))
        assert len(runtime) == 0  # nothing half-written is trusted
        assert runtime.forward([300, 301, 302]).shape == (1, both_weights[1].vocab_size)
    finally:
        runtime.close()


def test_ctrl_c_leaves_the_worker_serving_and_an_interrupted_call_costs_nothing_after(both_weights):
    """Ctrl-C reaches the worker too (one process group): it is the parent's to handle. A
    call it interrupts between request and reply leaves that reply behind, which the next
    call must not take for its own."""
    here = LlamaCppRuntime(both_weights[0], 256, threads=1)
    there = LlamaCppRuntime(both_weights[1], 256, threads=1)
    worker = both_weights[1].worker
    try:
        os.kill(worker._process.pid, signal.SIGINT)
        connection = worker._connection
        receive = connection.recv
        interrupted = []

        def interrupt_once():
            if not interrupted:
                interrupted.append(True)
                raise KeyboardInterrupt
            return receive()

        connection.recv = interrupt_once
        with pytest.raises(KeyboardInterrupt):
            there.forward([300, 301, 302])
        del connection.recv
        assert worker.running
        for runtime in (here, there):
            runtime.forward([400, 401])
        expected = here.forward_tree([7, 8], [1, 1], 2)
        assert torch.equal(there.forward_tree([7, 8], [1, 1], 2), expected)
    finally:
        here.close()
        there.close()
        there.close()  # twice is no error


def test_a_conversion_in_the_worker_is_announced(demo_target_path, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))  # an empty cache: the copy is made
    heard = []
    weights = llamacpp_process.load_weights(demo_target_path, "fp16", use_gpu=False, announce=heard.append)
    try:
        assert weights.file_type == "F16" and weights.path.is_relative_to(tmp_path)
        assert len(heard) == 1 and "F16" in heard[0]
    finally:
        weights.close()


def test_workers_are_wanted_wherever_llamacpp_is_a_gpu_build(tmp_path, monkeypatch):
    monkeypatch.delenv(llamacpp_process.PROCESS_VARIABLE, raising=False)
    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    for name in ("libllama.so", "libggml-base.so", "libggml-cpu.so"):
        (package / "lib" / name).touch()
    found = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(llamacpp_process.importlib.util, "find_spec", lambda name: found)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not llamacpp_process.gpu_build() and not llamacpp_process.wanted()  # pip's CPU build
    (package / "lib" / "libggml-cuda.so").touch()
    assert llamacpp_process.gpu_build() and llamacpp_process.wanted()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert llamacpp_process.wanted()  # numpy, loaded here first, is enough to crash its model loads
    monkeypatch.setenv(llamacpp_process.PROCESS_VARIABLE, "0")
    assert not llamacpp_process.wanted()
    (package / "lib" / "libggml-cuda.so").unlink()
    monkeypatch.setenv(llamacpp_process.PROCESS_VARIABLE, "1")
    assert llamacpp_process.wanted()


def test_a_worker_loads_llamacpp_before_numpy():
    """A CUDA build of llama.cpp segfaulted loading models in a process that had imported
    numpy first (H100, 2026-11-27): the worker's start imports llama_cpp before anything
    imports numpy."""
    watch = textwrap.dedent('''
        import importlib.abc, sys
        first = []
        class Watch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name in ("numpy", "llama_cpp"):
                    first.append(name)
        sys.meta_path.insert(0, Watch())
        module = sys.argv[1]
        sys.argv = [module, "not-a-socket", "not-a-file"]
        try:
            __import__("runpy").run_module(module, run_name="__main__")
        except ValueError:
            pass  # the arguments are no descriptors: everything is imported by then
        print(first[:2])
    ''')
    command = llamacpp_process._worker_command(101, 102)  # what the parent starts a worker with
    engine_root = Path(llamacpp_process.__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-P", "-c", watch, command[command.index("-m") + 1]], capture_output=True, text=True, cwd=engine_root,
                          env=dict(os.environ, PYTHONPATH=str(engine_root)), timeout=120)
    assert done.stdout.strip() == "['llama_cpp', 'numpy']", done.stderr


@pytest.mark.skipif(
    not (llamacpp_process.gpu_build() and torch.cuda.is_available()), reason="needs llama.cpp built for a GPU, and CUDA torch"
)
def test_a_worker_runs_llamacpp_on_the_gpu_beside_cuda_torch(f32_path):
    """What workers are for: this process holds CUDA torch, the worker offloads every layer.
    Its logits are the CPU worker's within what GPU and CPU kernels differ by (0.25 is a
    first bound, to be tightened once measured) and pick the same tokens."""
    torch.zeros(1, device="cuda")  # CUDA torch in this process, initialised
    on_gpu = llamacpp_process.load_weights(f32_path, "stored", use_gpu=True)
    on_cpu = llamacpp_process.load_weights(f32_path, "stored", use_gpu=False)
    gpu, cpu = LlamaCppRuntime(on_gpu, 256), LlamaCppRuntime(on_cpu, 256, threads=2)
    try:
        assert on_gpu.gpu_layers != 0 and on_cpu.gpu_layers == 0
        for expected, got in zip(run_the_same_calls(cpu, seed=5), run_the_same_calls(gpu, seed=5), strict=True):
            torch.testing.assert_close(got, expected, atol=0.25, rtol=0)
            assert torch.equal(got.argmax(-1), expected.argmax(-1))
    finally:
        gpu.close()
        cpu.close()
        on_gpu.close()
        on_cpu.close()


def test_llamacpp_pythons_own_generation_runs_in_a_worker_alike(demo_target_path, monkeypatch):
    """The bench's llamacpp-ar peer, where Tandem's llama.cpp runs in workers: the same reply."""
    if not IN_PROCESS_IS_SAFE:
        pytest.skip("llama.cpp's GPU build cannot load beside CUDA torch")
    settings = DecodeSettings(max_new_tokens=16)  # greedy
    monkeypatch.setenv(llamacpp_process.PROCESS_VARIABLE, "0")
    here = LlamaCppGeneration(demo_target_path, 512, 1, 0, settings)
    monkeypatch.setenv(llamacpp_process.PROCESS_VARIABLE, "1")
    there = LlamaCppGeneration(demo_target_path, 512, 1, 0, settings)
    assert isinstance(there._generation, llamacpp_process.WorkerGeneration)
    reply = there("Name three rivers.", [], 16)
    assert len(reply) > 3 and reply == here("Name three rivers.", [], 16)
    with pytest.raises(ValueError, match="missing.gguf"):  # what Llama raises here too
        LlamaCppGeneration(demo_target_path.with_name("missing.gguf"), 512, 1, 0, settings)


def test_a_worker_that_dies_is_a_clear_error_not_a_hang(f32_path):
    weights = llamacpp_process.load_weights(f32_path, "stored", use_gpu=False)
    runtime = LlamaCppRuntime(weights, 128, threads=1)
    runtime.forward([300, 301])
    os.kill(weights.worker._process.pid, signal.SIGKILL)
    with pytest.raises(ModelLoadError, match="stopped by SIGKILL.*Choose the model again"):
        runtime.forward([302])
    assert len(runtime) == 0
    runtime.close()  # closing what is gone is no error
    weights.close()


def test_a_pair_loaded_with_workers_never_loads_llamacpp_here_and_writes_the_same_reply(tmp_path):
    """Chat turns through `load_model` with TANDEM_LLAMACPP_PROCESS=1, in a fresh interpreter
    (this one has loaded llama.cpp already): the target verifies trees its self-draft proposes
    in another worker, and the greedy tree reply is plain decoding's."""
    script = textwrap.dedent("""
        import json, sys
        from engine.chat_prompt import Message
        from engine.config import DecodeSettings, ModelSpec, PairConfig
        from engine.models import load_model
        from engine.session import LoadedPair
        target = load_model(ModelSpec("demo-target", precision="fp32"), runtime="llama.cpp")
        draft = load_model(ModelSpec("demo-target", precision="fp32"), runtime="llama.cpp", as_draft=True)
        pair = LoadedPair(PairConfig("self", ModelSpec("demo-target"), ModelSpec("demo-target")), target, draft)
        replies = {}
        for method in ("ar", "tree"):
            settings = DecodeSettings(method=method, max_new_tokens=24, tree_shape="4x3" if method == "tree" else "auto")
            replies[method] = list(pair.generate([Message("user", "Name three rivers.")], settings))[-1].token_ids
        print(json.dumps({"replies": replies, "runtime": target.runtime, "llama_cpp_here": "llama_cpp" in sys.modules}))
        pair.close()
    """)
    root = Path(__file__).resolve().parents[3]
    environment = dict(os.environ, TANDEM_LLAMACPP_PROCESS="1", TANDEM_THREADS="1", PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["llama_cpp_here"] is False
    assert answer["runtime"] == "llama.cpp (own process)"
    assert len(answer["replies"]["ar"]) == 24
    assert answer["replies"]["tree"] == answer["replies"]["ar"]


def _worker_pids() -> list[int]:
    import psutil

    return [child.pid for child in psutil.Process().children() if "llamacpp_worker" in " ".join(child.cmdline())]
