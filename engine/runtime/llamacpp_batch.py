"""Many sequences at once on llama.cpp (`SequenceBatch`): continuous batching, the way
distillation writes a target's replies on a CPU without the native forward.

Each of up to `slots` sequences has its own KV stream (`kv_unified` off), so a token attends
over its own sequence only, not over every sequence's cells. Each step decodes one new token
for every running sequence; once an eighth of the slots are free, a decode of its own feeds
the prompts that take them. Short replies never leave the batch half idle the way a fixed
batch waiting for its longest reply does.

Measured on the 2-core development CPU, demo target as F16, 128 slots: one decode of 128
one-token steps costs ~140 ms at short contexts, and the demo draft's data run (prompts of
~70 tokens, replies of up to 256) wrote ~400 reply tokens/s, where batched torch sampling on
the same CPU wrote ~250. F16 decodes faster than Q8_0 here (~15%) and holds a Q4/Q8 file's
weights exactly.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError, OutOfMemoryError
from .cpu import physical_cores
from .llamacpp_context import load_weights, verifying_attention
from .llamacpp_library import failure_reason, forget_log, library

MIN_BATCH_TOKENS = 512

Entry = tuple[int, int, int, bool]  # (token, position, slot, wants logits)


class LlamaCppSequenceBatch:
    """A llama.cpp context of `slots` independent sequences of up to `sequence_tokens` each.

    While it is open, torch runs on one thread: the sampler's few ops per step would
    otherwise leave its OpenMP workers spinning on the cores llama.cpp's threads need."""

    def __init__(self, gguf: Path, slots: int, sequence_tokens: int, threads: int | None = None):
        self._llama = library()
        self.weights = load_weights(gguf, use_gpu=True)  # offloads only where the build can
        self.slots = slots
        self.sequence_tokens = sequence_tokens
        self.vocab_size = self.weights.vocab_size
        self.batch_tokens = max(MIN_BATCH_TOKENS, slots + sequence_tokens)
        params = self._llama.llama_context_default_params()
        params.n_ctx = slots * sequence_tokens  # split evenly between the sequences' streams
        params.n_batch = params.n_ubatch = self.batch_tokens
        params.n_seq_max = slots
        params.n_outputs_max = self.batch_tokens
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads or physical_cores()
        params.no_perf = True
        # The chat runtime's attention (flash over a Q8_0 cache on the CPU), so that a greedy
        # reply written here is, bit for bit, the one the runtime writes for the same prompt
        # (the plain kernel, 7% more replies a second here, gave other bits: docs/BENCHMARKS.md)
        attention = verifying_attention(self.weights)
        params.flash_attn_type = attention.kernel
        if attention.cache_type is not None:
            params.type_k = params.type_v = attention.cache_type
        forget_log()
        self._context = self._llama.llama_init_from_model(self.weights.handle, params)
        if not self._context:
            self.weights.close()
            reason = failure_reason("the machine is probably out of memory: try fewer slots or shorter sequences")
            raise OutOfMemoryError(f"llama.cpp could not make a context of {slots} × {sequence_tokens} tokens: {reason}.")
        self._memory = self._llama.llama_get_memory(self._context)
        self._batch = self._llama.llama_batch_init(self.batch_tokens, 0, 1)
        self._positions: dict[int, int] = {}  # running slot -> the position of its next token
        self._prompts: list[Entry] = []  # the tokens of the prompts started since the last step
        # New sequences start when an eighth of the slots is free: a prompt decode for several.
        self._refill_at = max(1, slots // 8)
        self._torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def close(self) -> None:
        if self._context:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._context)
            self._context = None
            self.weights.close()
            torch.set_num_threads(self._torch_threads)

    # The contract

    def can_start(self) -> bool:
        if self._prompts:
            return True  # this step's prompt decode takes more while they fit
        free = self.slots - len(self._positions)
        return free >= self._refill_at or not self._positions

    def fits(self, prompt_length: int) -> bool:
        return len(self._prompts) + prompt_length <= self.batch_tokens

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        self._llama.llama_memory_seq_rm(self._memory, slot, -1, -1)
        last = len(prompt_ids) - 1
        self._prompts += [(token, index, slot, index == last) for index, token in enumerate(prompt_ids)]
        self._positions[slot] = len(prompt_ids)

    def step(self, next_tokens: list[tuple[int, int]]) -> tuple[list[int], torch.Tensor]:
        steps = []
        for slot, token in next_tokens:
            steps.append((token, self._positions[slot], slot, True))
            self._positions[slot] += 1
        # Prompts are fed in decodes of their own: llama.cpp splits a batch whose sequences
        # bring different numbers of tokens into one sub-batch per shape, so a prompt mixed
        # into the one-token steps of the others would cut each step into pieces.
        prompts, self._prompts = self._prompts, []
        slots, parts = [], []
        for queued in (prompts, steps):
            if not queued:
                continue
            if parts:  # the next decode overwrites llama.cpp's logits buffer
                parts[-1] = parts[-1].clone()
            decoded = self._decode(queued)
            slots += decoded
            parts.append(self._last_logits(len(decoded)))
        if not parts:
            return [], torch.empty(0, self.vocab_size)
        return slots, parts[0] if len(parts) == 1 else torch.cat(parts)

    def release(self, slot: int) -> None:
        del self._positions[slot]

    def _last_logits(self, rows: int) -> torch.Tensor:
        """(rows, V) float32: the last decode's logits, read in llama.cpp's own buffer."""
        buffer = self._llama.llama_get_logits(self._context)
        return torch.from_numpy(np.ctypeslib.as_array(buffer, shape=(rows, self.vocab_size)))

    def _decode(self, queued: list[Entry]) -> list[int]:
        """Run one decode; returns the slot of each logits row, in row order."""
        # In slot order: llama.cpp puts only consecutive sequences into one sub-batch when
        # each has a KV stream of its own (~3.5× slower steps out of order).
        queued.sort(key=lambda entry: entry[2])
        batch = self._batch
        slots = []
        for row, (token, position, slot, wanted) in enumerate(queued):
            batch.token[row] = token
            batch.pos[row] = position
            batch.n_seq_id[row] = 1
            batch.seq_id[row][0] = slot
            batch.logits[row] = wanted
            if wanted:
                slots.append(slot)
        batch.n_tokens = len(queued)
        status = self._llama.llama_decode(self._context, batch)
        if status == 1:
            raise OutOfMemoryError("llama.cpp found no room in its KV cache: try fewer slots or shorter sequences.")
        if status != 0:
            raise ModelLoadError(f"llama.cpp failed to run {self.weights.path.name} (llama_decode returned {status}).")
        return slots
