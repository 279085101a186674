"""llama.cpp in a worker process: GGUF models on a GPU next to CUDA torch.

A CUDA build of llama.cpp and CUDA torch each bring their own CUDA runtime and libraries;
in one process the two have crashed (issue 21). A worker that never imports torch
(`llamacpp_worker`) keeps them apart: it loads the model, and the `LlamaCppRuntime` here
drives its contexts as it drives one of its own, so every algorithm runs unchanged.

What it costs per call: one small pickled request and reply over a socket, and one copy of
the outputs out of a file both processes map (logits never go through the socket). The
worker does everything else as the in-process runtime does, on the same code
(`llamacpp_context`). docs/BENCHMARKS.md has the measured overhead.

`wanted()` decides: a model that may run on a GPU while this process has CUDA torch runs in
a worker; everything else runs here, as before. TANDEM_LLAMACPP_PROCESS=1 or 0 forces it.
"""
from __future__ import annotations

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
from .llamacpp_worker import FACT_NAMES, WORKER_ARGUMENT

PROCESS_VARIABLE = "TANDEM_LLAMACPP_PROCESS"
_ENGINE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the `engine` package


def wanted(device: str) -> bool:
    """Whether a GGUF model meant for `device` should run in a worker process: where llama.cpp
    may offload it to a GPU (any device but "cpu") and this process's torch has CUDA. On a
    CPU-only machine llama.cpp stays in this process, with no worker to start or feed."""
    chosen = os.environ.get(PROCESS_VARIABLE, "")
    if chosen in ("0", "1"):
        return chosen == "1"
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()


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
        _, self.hidden_width, self.threads = self._worker.exchange(
            ("open", self._id, context_length, threads, hidden_states, self.feature_layers)
        )
        self._feature_width = weights.hidden_size * len(self.feature_layers)

    def run(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> DecodeOutputs:
        shapes = [(logits_wanted, self.vocab_size)]
        shapes += [(logits_wanted, self.hidden_width)] if self.hidden_width else []
        shapes += [(len(new_ids), self._feature_width)] if self.feature_layers else []
        worker = self._worker
        with worker.lock:  # the shared file holds one run's outputs at a time
            worker.buffer.fit(sum(rows * width for rows, width in shapes) * 4)
            request = ("run", self._id, list(new_ids), list(parents), list(positions), logits_wanted, worker.buffer.size)
            _, self.threads = worker.exchange(request)
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
        if self._worker.running:
            self._worker.exchange(("close", self._id))


class SharedBuffer:
    """The parent's side of the file the worker writes outputs into: an anonymous file that
    only grows (to the largest run so far), mapped here and in the worker."""

    def __init__(self):
        if hasattr(os, "memfd_create"):  # Linux: memory, never a disk
            self.descriptor = os.memfd_create("tandem-llamacpp-outputs")
            self._file = None
        else:
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
        if self._map is not None:
            self._map.close()
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
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
        else:
            os.close(self.descriptor)


class LlamaCppWorker:
    """One worker process and the means to talk to it; calls from any thread, one at a time."""

    def __init__(self, model_name: str):
        self._model_name = model_name
        self.lock = threading.RLock()
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
        except OSError as error:
            ours.close()
            self.buffer.close()
            raise ModelLoadError(f"Could not start llama.cpp's process for {model_name}: {error}.") from error
        finally:
            theirs.close()
        self._connection = Connection(ours.detach())

    @property
    def running(self) -> bool:
        return self._connection is not None and self._process.poll() is None

    def exchange(self, request: tuple, announce: Callable[[str], None] | None = None) -> tuple:
        """Send `request` and return the worker's reply; its errors are raised here."""
        with self.lock:
            if self._connection is None:
                raise ModelLoadError(f"llama.cpp's process for {self._model_name} was closed; load the model again.")
            try:
                self._connection.send(request)
                reply = self._connection.recv()
                while reply[0] == "announce":
                    if announce is not None:
                        announce(reply[1])
                    reply = self._connection.recv()
            except (EOFError, OSError) as error:
                raise ModelLoadError(self._death_notice()) from error
        if reply[0] == "error":
            raise _worker_error(reply[1], reply[2])
        return reply

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
    return [sys.executable, "-m", "engine.runtime.llamacpp_worker", *descriptors]


def _worker_error(kind: str, message: str) -> Exception:
    """The worker's exception, raised again here as the same kind where Tandem has it."""
    if kind == "MemoryError":
        return OutOfMemoryError(message)
    if kind == "ValueError":
        return ValueError(message)
    known = getattr(errors, kind, None)
    if isinstance(known, type) and issubclass(known, errors.TandemError):
        return known(message)
    return ModelLoadError(f"llama.cpp's process failed ({kind}): {message}")
