"""llama.cpp in a worker process: GGUF models on a GPU next to CUDA torch.

A CUDA build of llama.cpp and CUDA torch each bring their own CUDA runtime and libraries;
in one process the two have crashed (issue 21). And a CUDA build of llama.cpp segfaults
loading any model in a process that imported numpy before it (H100, 2026-11-27), as this
one always has. A worker that never imports torch and loads llama.cpp before numpy
(`llamacpp_worker_start`, `llamacpp_worker`) keeps them apart: it loads the model, and the
`LlamaCppRuntime` here drives its contexts as it drives one of its own, so every algorithm
runs unchanged.

What it costs per call: one small pickled request and reply over a socket, and one copy of
the outputs out of a file both processes map (logits never go through the socket). The
worker does everything else as the in-process runtime does, on the same code
(`llamacpp_context`). docs/BENCHMARKS.md has the measured overhead.

`wanted()` decides: where the installed llama.cpp has a CUDA or ROCm backend of its own,
every GGUF model runs in a worker (even one meant for the CPU: loading the library here is
what crashes); with pip's CPU build llama.cpp runs here, as before.
TANDEM_LLAMACPP_PROCESS=1 or 0 forces it.
"""
from __future__ import annotations

import importlib.util
import itertools
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from .. import errors
from ..errors import ModelLoadError, OutOfMemoryError
from .llamacpp_context import DecodeOutputs, GgufFacts
from .llamacpp_worker import FACT_NAMES
from .llamacpp_worker_start import WORKER_ARGUMENT

PROCESS_VARIABLE = "TANDEM_LLAMACPP_PROCESS"
_ENGINE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the `engine` package


def wanted() -> bool:
    """Whether llama.cpp should run in worker processes rather than in this one: wherever
    it has a GPU backend (see the module's note). Never on Windows, where a worker cannot
    inherit the socket and shared file this one uses."""
    chosen = os.environ.get(PROCESS_VARIABLE, "")
    if sys.platform == "win32":
        return False
    if chosen in ("0", "1"):
        return chosen == "1"
    return gpu_build()


#: the backend libraries of a llama.cpp build that brings CUDA (or ROCm) libraries of its own
GPU_BACKENDS = ("ggml-cuda", "ggml-hip", "ggml-musa")


def gpu_build() -> bool:
    """Whether the installed llama-cpp-python was built with a CUDA-like backend, told by its
    library files without loading them (loading them next to CUDA torch is what must not
    happen). pip's default build is CPU-only: ggml-base, ggml-cpu, ggml, llama."""
    found = importlib.util.find_spec("llama_cpp")
    if found is None or not found.submodule_search_locations:
        return False
    for folder in found.submodule_search_locations:
        for library in Path(folder).glob("**/*ggml*"):
            if any(backend in library.name for backend in GPU_BACKENDS):
                return True
    return False


def load_weights(gguf: Path, precision: str, use_gpu: bool, announce: Callable[[str], None] | None = None) -> WorkerWeights:
    """Start a worker and load `gguf` there, first converted to `precision` where that is one
    of llama.cpp's file types (as `llamacpp_library.quantised_copy` converts it here);
    `announce` hears the worker's progress messages. Failures are `ModelLoadError`s."""
    worker = LlamaCppWorker(gguf.name)
    try:
        _, facts = worker.exchange(("load", str(gguf), precision, use_gpu), announce)
    except BaseException:
        worker.stop()
        raise
    facts["path"] = Path(facts["path"])
    return WorkerWeights(**facts, worker=worker)


@dataclass
class WorkerWeights(GgufFacts):
    """A GGUF model loaded in a worker process."""

    worker: LlamaCppWorker | None = field(default=None, repr=False)

    def open_context(
        self, context_length: int, threads: int | None = None, hidden_states: bool = False, feature_layers: tuple[int, ...] = (),
    ) -> WorkerContext:
        return WorkerContext(self, context_length, threads, hidden_states, feature_layers)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()


class WorkerContext:
    """A llama.cpp context in the worker, with `LlamaCppContext`'s methods."""

    _ids = itertools.count()

    def __init__(self, weights: WorkerWeights, context_length: int, threads: int | None, hidden_states: bool, feature_layers):
        self.weights = weights
        self.vocab_size = weights.vocab_size
        self.feature_layers = tuple(feature_layers)
        self._worker = weights.worker
        self._id = next(self._ids)
        self._closed = True  # until the worker has opened it
        _, self.hidden_width, self.threads = self._worker.exchange(
            ("open", self._id, context_length, threads, hidden_states, self.feature_layers)
        )
        self._feature_width = weights.hidden_size * len(self.feature_layers)
        self._closed = False

    def run(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> DecodeOutputs:
        shapes = [(logits_wanted, self.vocab_size)]
        shapes += [(logits_wanted, self.hidden_width)] if self.hidden_width else []
        shapes += [(len(new_ids), self._feature_width)] if self.feature_layers else []
        # Plain ints: a torch scalar would make the worker import torch to unpickle it.
        request = ("run", self._id, [int(token) for token in new_ids], [int(parent) for parent in parents],
                   [int(position) for position in positions], int(logits_wanted))
        worker = self._worker
        with worker.lock:  # the shared file holds one run's outputs at a time
            worker.check_running()
            worker.buffer.fit(sum(rows * width for rows, width in shapes) * 4)
            _, self.threads = worker.exchange((*request, worker.buffer.size))
            arrays = worker.buffer.copies(shapes)
        hidden = arrays[1] if self.hidden_width else None
        features = arrays[-1] if self.feature_layers else None
        return DecodeOutputs(arrays[0], hidden, features)

    def keep(self, prefix: int, extra_slots: list[int]) -> None:
        self._worker.exchange(("keep", self._id, prefix, list(extra_slots)))

    def clear(self) -> None:
        if self._worker.running:  # a worker that is gone holds nothing (and has said why)
            self._worker.exchange(("clear", self._id))

    def close(self) -> None:
        """Free the context's cache in the worker; again, or once the worker is gone, nothing."""
        if not self._closed:
            self._closed = True
            self._worker.forget(self._id)

    def __del__(self):
        # Not an exchange from here: the collector may run mid-exchange on this very thread.
        if not getattr(self, "_closed", True):
            self._closed = True
            self._worker.abandoned.append(self._id)


class WorkerGeneration:
    """llama-cpp-python's own generation (`llamacpp_generation.PlainGeneration`, the same
    arguments) in a worker process of its own."""

    def __init__(self, gguf: str, *arguments):
        self._worker = LlamaCppWorker(Path(gguf).name)
        try:
            self._worker.exchange(("generation", gguf, *arguments))
        except BaseException:
            self._worker.stop()
            raise

    def generate(self, prompt: str, max_new_tokens: int) -> tuple[int, ...]:
        return tuple(self._worker.exchange(("generate", prompt, max_new_tokens))[1])

    def __del__(self):
        if hasattr(self, "_worker"):
            self._worker.stop()


class SharedBuffer:
    """The parent's side of the file the worker writes outputs into: an anonymous file that
    only grows (to the largest run so far), mapped here and in the worker."""

    def __init__(self):
        self._file = None
        try:  # Linux: memory, never a disk
            self.descriptor = os.memfd_create("tandem-llamacpp-outputs")
        except (AttributeError, OSError):
            self._file = tempfile.TemporaryFile()
            self.descriptor = self._file.fileno()
        self.size = 0
        self._map: mmap.mmap | None = None
        self.fit(1 << 20)

    def fit(self, needed: int) -> None:
        if needed <= self.size:
            return
        size = max(needed, 2 * self.size)
        size += -size % mmap.PAGESIZE
        os.ftruncate(self.descriptor, size)
        # The old map is dropped, not closed: closing it would fail while any view of it
        # lives on (in a traceback, say); it goes when the last one does.
        self._map = None
        self._map = mmap.mmap(self.descriptor, size)
        self.size = size

    def copies(self, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
        """Copies of the float32 arrays laid out one after another from the file's start."""
        arrays, offset = [], 0
        for shape in shapes:
            view = np.ndarray(shape, dtype=np.float32, buffer=self._map, offset=offset)
            arrays.append(view.copy())
            offset += view.nbytes
            del view  # no view of the map may outlive it
        return arrays

    def close(self) -> None:
        self._map = None
        if self._file is not None:
            self._file.close()
        elif self.descriptor >= 0:
            os.close(self.descriptor)
        self.descriptor = -1


class LlamaCppWorker:
    """One worker process and the means to talk to it; calls from any thread, one at a time.

    Every request carries a number that its reply repeats: a call interrupted between the two
    (Ctrl-C in a terminal chat) leaves a reply behind, which the next call skips."""

    def __init__(self, model_name: str):
        self._model_name = model_name
        self.lock = threading.RLock()
        self.abandoned: list[int] = []  # contexts dropped without close(), freed by the next call
        self._numbers = itertools.count(1)
        self._connection: Connection | None = None
        self.buffer = SharedBuffer()
        ours, theirs = socket.socketpair()
        # What the worker writes to stderr is kept: its last line is the reason if it dies.
        self._stderr = tempfile.TemporaryFile()
        command = _worker_command(theirs.fileno(), self.buffer.descriptor)
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ENGINE_ROOT), os.environ.get("PYTHONPATH")])))
        try:
            self._process = subprocess.Popen(
                command, pass_fds=(theirs.fileno(), self.buffer.descriptor), stdin=subprocess.DEVNULL,
                stdout=self._stderr, stderr=self._stderr, env=environment,
            )
        except Exception as error:  # noqa: BLE001  (an OSError, or a platform without pass_fds)
            ours.close()
            self.buffer.close()
            self._stderr.close()
            raise ModelLoadError(f"Could not start llama.cpp's process for {model_name}: {error}.") from error
        finally:
            theirs.close()
        self._connection = Connection(ours.detach())

    @property
    def running(self) -> bool:
        return self._connection is not None and self._process.poll() is None

    def check_running(self) -> None:
        if self._connection is None:
            raise ModelLoadError(f"llama.cpp's process for {self._model_name} was closed; load the model again.")

    def exchange(self, request: tuple, announce: Callable[[str], None] | None = None) -> tuple:
        """Send `request` and return the worker's reply; its errors are raised here."""
        with self.lock:
            self.check_running()
            while self.abandoned:
                self._send_and_receive(("close", self.abandoned.pop()), None)
            reply = self._send_and_receive(request, announce)
        if reply[0] == "error":
            raise _worker_error(reply[1], reply[2])
        return reply

    def forget(self, context_id: int) -> None:
        """Close a context; nothing to do once the worker is gone."""
        with self.lock:
            if self.running:
                try:
                    self.exchange(("close", context_id))
                except ModelLoadError:
                    pass  # it died meanwhile: its contexts went with it

    def _send_and_receive(self, request: tuple, announce: Callable[[str], None] | None) -> tuple:
        number = next(self._numbers)
        try:
            self._connection.send((number, *request))
            while True:
                answered, *reply = self._connection.recv()
                if answered != number:
                    continue  # the reply to a call that was interrupted before it came
                if reply[0] != "announce":
                    return tuple(reply)
                if announce is not None:
                    announce(reply[1])
        except (EOFError, OSError) as error:
            raise ModelLoadError(self._death_notice()) from error

    def stop(self) -> None:
        """End the worker (closing the socket tells it to) and free what this side holds."""
        with self.lock:
            if self._connection is None:
                return
            self._connection.close()
            self._connection = None
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self.buffer.close()
            self._stderr.close()

    def _death_notice(self) -> str:
        try:
            status = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = None
        if status is not None and status < 0:
            ended = f"was stopped by {signal.Signals(-status).name}"
        else:
            ended = f"ended (exit status {status})"
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().decode(errors="replace").splitlines() if line.strip()]
        said = f": {lines[-1].strip()}" if lines else ""
        return f"llama.cpp's process for {self._model_name} {ended}{said}. Choose the model again to reload it."


def _worker_command(socket_descriptor: int, buffer_descriptor: int) -> list[str]:
    descriptors = [str(socket_descriptor), str(buffer_descriptor)]
    if getattr(sys, "frozen", False):  # the bundle's executable is Tandem, not Python
        return [sys.executable, WORKER_ARGUMENT, *descriptors]
    # -P: the current folder stays off the import path, so no `engine` there can stand in.
    return [sys.executable, "-P", "-m", "engine.runtime.llamacpp_worker_start", *descriptors]


def _worker_error(kind: str, message: str) -> Exception:
    """The worker's exception, raised again here as the same kind where Tandem has it."""
    if kind == "MemoryError":
        return OutOfMemoryError(message)
    if kind == "ValueError":
        return ValueError(message)
    known = getattr(errors, kind, None)
    if isinstance(known, type) and issubclass(known, (errors.TandemError, errors.ConfigError)):
        return known(message)
    return ModelLoadError(f"llama.cpp's process failed ({kind}): {message}")
