"""The llama.cpp runtime: a GGUF model run by llama.cpp's own kernels (llama-cpp-python's
low-level API), behind the same contract as the torch runtime.

The context it drives (`llamacpp_context.LlamaCppContext`) runs here, or in a worker process
(`llamacpp_process`) where llama.cpp must not share this process (on a GPU next to CUDA
torch); the runtime is the same either way.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import ModelLoadError
from .base import ModelRuntime
from .llamacpp_context import (  # noqa: F401  (load_weights: the name the engine loads GGUF files by)
    DecodeOutputs,
    LlamaCppWeights,
    load_weights,
    verifying_attention,
)

if TYPE_CHECKING:
    from .llamacpp_process import WorkerWeights


def token_embeddings(path: Path) -> torch.Tensor:
    """(V, H) float32: the token embedding matrix of a GGUF file, dequantised (what an EAGLE-3
    head reads as its input tokens' embeddings). Read with the gguf package: portable, and
    llama.cpp's own getter has C++ linkage."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    for tensor in GGUFReader(str(path)).tensors:
        if tensor.name == "token_embd.weight":
            rows = dequantize(tensor.data, tensor.tensor_type)  # (V, H)
            return torch.from_numpy(np.array(rows, dtype=np.float32))  # a writable copy
    raise ModelLoadError(f"{path.name} has no token embeddings (token_embd.weight).")


class LlamaCppRuntime(ModelRuntime):
    name = "llama.cpp"

    def __init__(
        self, weights: LlamaCppWeights | WorkerWeights, context_length: int, threads: int | None = None,
        hidden_states: bool = False, feature_layers: tuple[int, ...] = (),
    ):
        """`weights` loaded here (`load_weights`) or in a worker process (`llamacpp_process`):
        each opens its own kind of context, which this runtime drives the same way."""
        context = weights.open_context(context_length, threads, hidden_states, tuple(feature_layers))
        super().__init__(context.vocab_size)
        self._context = context
        self.weights = weights
        self.supports_trees = weights.supports_trees
        self.returns_hidden = bool(context.hidden_width)
        self.feature_layers = tuple(context.feature_layers)
        self._last: DecodeOutputs | None = None

    def close(self) -> None:
        self._context.close()

    @property
    def threads(self) -> int:
        """The threads the next decode runs on."""
        return self._context.threads

    # The contract

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        start = len(self)
        return self._run_tree(new_ids, list(range(start - 1, start - 1 + len(new_ids))), list(range(start, start + len(new_ids))), logits_wanted)

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        self._last = self._context.run(new_ids, parents, positions, logits_wanted)
        return torch.from_numpy(self._last.logits)

    def _last_features(self) -> torch.Tensor:
        return torch.from_numpy(self._last.features)

    def last_hidden_states(self) -> torch.Tensor:
        if self._last is None or self._last.hidden is None:
            return super().last_hidden_states()
        return torch.from_numpy(self._last.hidden)

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        self._context.keep(prefix, extra_slots)

    def _clear(self) -> None:
        self._context.clear()
