"""The llama.cpp worker: a process that loads one GGUF model and runs its contexts for
`llamacpp_process` in the parent (or runs llama-cpp-python's own generation of one). It
never imports torch (nor anything that does), which is the point: llama.cpp's CUDA
libraries and torch's own never meet in one process.

Started by `llamacpp_worker_start` (llama.cpp's libraries before numpy's), with two
inherited file descriptors: a socket for requests and replies (small pickled tuples), and a
shared file that both sides map, where a run writes its logits, hidden states and features
so that megabytes of floats never go through the socket.

Requests, each answered once, both with the number the parent gave the request first (errors
as ("error", kind, message)):
    ("load", path, precision, use_gpu)   -> ("announce", text)*, ("loaded", facts)
    ("open", id, length, threads, hidden_states, feature_layers) -> ("opened", width, threads)
    ("run", id, new_ids, parents, positions, logits_wanted, buffer_size) -> ("ran", threads)
    ("keep", id, prefix, extra_slots) / ("clear", id) / ("close", id) -> ("done",)
    ("generation", gguf, length, threads, gpu_layers, sampling, seed, runtime_attention) -> ("ready",)
    ("generate", prompt, max_new_tokens) -> ("generated", token_ids)   (the llamacpp-ar peer)
A closed socket ends the worker.
"""
from __future__ import annotations

import mmap
import signal
from pathlib import Path
from multiprocessing.connection import Connection

import numpy as np


class SharedBuffer:
    """The worker's side of the shared file: float32 arrays laid out one after another from
    its start, remapped when the parent has grown the file."""

    def __init__(self, descriptor: int):
        self._descriptor = descriptor
        self._map: mmap.mmap | None = None
        self._used = 0

    def fit(self, size: int) -> None:
        if self._map is None or len(self._map) != size:
            self._map = None  # dropped, not closed: a view that lives on would make close() fail
            self._map = mmap.mmap(self._descriptor, size)
        self._used = 0

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        array = np.ndarray(shape, dtype=np.float32, buffer=self._map, offset=self._used)
        self._used += array.nbytes
        return array


def serve(connection: Connection, buffer: SharedBuffer) -> None:
    from .llamacpp_context import LlamaCppContext, load_weights
    from .llamacpp_generation import PlainGeneration
    from .llamacpp_library import QUANTISED_FILE_TYPES, quantised_copy

    weights = generation = None
    contexts: dict[int, LlamaCppContext] = {}
    while True:
        try:
            number, kind, *arguments = connection.recv()
        except (EOFError, OSError):  # the parent closed its end, or is gone
            break

        def reply(*message, number=number) -> None:
            connection.send((number, *message))

        try:
            if kind == "load":
                path, precision, use_gpu = arguments
                if precision in QUANTISED_FILE_TYPES:
                    path = str(quantised_copy(Path(path), precision, announce=lambda text: reply("announce", text)))
                weights = load_weights(Path(path), use_gpu)
                facts = {name: getattr(weights, name) for name in FACT_NAMES}
                reply("loaded", facts)
            elif kind == "open":
                context_id, length, threads, hidden_states, feature_layers = arguments
                context = LlamaCppContext(weights, length, threads, hidden_states, tuple(feature_layers))
                contexts[context_id] = context
                reply("opened", context.hidden_width, context.threads)
            elif kind == "run":
                context_id, new_ids, parents, positions, logits_wanted, buffer_size = arguments
                context = contexts[context_id]
                buffer.fit(buffer_size)
                outputs = context.run(new_ids, parents, positions, logits_wanted, allocate=buffer.allocate)
                del outputs  # views of the shared map: none may outlive a remap
                reply("ran", context.threads)
            elif kind == "generation":  # llama-cpp-python's own generation (the llamacpp-ar peer)
                generation = PlainGeneration(*arguments)
                reply("ready")
            elif kind == "generate":
                reply("generated", generation.generate(*arguments))
            elif kind == "close":
                context = contexts.pop(arguments[0], None)
                if context is not None:
                    context.close()
                reply("done")
            elif kind in ("keep", "clear"):
                context = contexts[arguments[0]]
                if kind == "keep":
                    context.keep(*arguments[1:])
                else:
                    context.clear()
                reply("done")
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as error:  # the parent raises it again; the worker serves on
            reply("error", type(error).__name__, str(error))
    for context in contexts.values():
        context.close()
    if weights is not None:
        weights.close()


#: the `GgufFacts` fields the parent gets back, the model's handle excepted
FACT_NAMES = (
    "path", "vocab_size", "context_length", "eos_token_ids", "supports_trees", "gpu_layers", "file_type",
    "hidden_size", "layer_count",
)


def main(arguments: list[str]) -> int:
    # Ctrl-C in a terminal reaches the whole process group; it is the parent's to handle
    # (a terminal chat keeps its reply and goes on), and the worker serves on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    socket_descriptor, buffer_descriptor = (int(argument) for argument in arguments)
    serve(Connection(socket_descriptor), SharedBuffer(buffer_descriptor))
    return 0

