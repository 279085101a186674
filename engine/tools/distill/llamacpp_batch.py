"""Many target replies at once on llama.cpp: continuous batching for distillation data.

Each of up to `slots` sequences has its own KV stream (`kv_unified` off), so a token attends
over its own sequence only, not over every sequence's cells. Each step decodes one new token
for every running sequence; a reply that ends frees its slot, and once an eighth of the slots
are free, one decode feeds the prompts that take them. Short replies never leave the batch
half idle the way a fixed batch waiting for its longest reply does.

Measured on the 2-core development CPU, demo target as F16, 128 slots: one decode of 128
one-token steps costs ~140 ms at short contexts, and the demo draft's data run (prompts of
~70 tokens, replies of up to 256) wrote ~400 reply tokens/s, where batched torch sampling on
the same CPU wrote ~250. F16 decodes faster than Q8_0 here (~15%) and holds a Q4/Q8 file's
weights exactly.

Each reply's next token is drawn as `replies.sample_next` draws it (from the target's top 64).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from ...errors import ModelLoadError, OutOfMemoryError
from ...runtime.cpu import physical_cores
from ...runtime.llamacpp import load_weights, verifying_attention
from ...runtime.llamacpp_library import failure_reason, forget_log, library
from .replies import Job, Reply, RunningReply, check_prompt_fits, sample_next

MIN_BATCH_TOKENS = 512


class LlamaCppBatchWriter:
    """A llama.cpp context of `slots` independent sequences of up to `sequence_tokens` each."""

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

    def close(self) -> None:
        if self._context:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._context)
            self._context = None
            self.weights.close()

    def write(
        self,
        jobs: Iterable[Job],
        max_new_tokens: int,
        temperature: float,
        stored_top_k: int,
        stop_ids: frozenset[int],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[Reply]:
        """Yield each job's reply as it ends. Stopping drops the replies still running."""
        # torch's few ops per step on one thread: its OpenMP workers would otherwise spin on
        # the cores llama.cpp's threads need.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield from self._write(jobs, max_new_tokens, temperature, stored_top_k, stop_ids, should_stop)
        finally:
            torch.set_num_threads(threads)

    def _write(self, jobs, max_new_tokens, temperature, stored_top_k, stop_ids, should_stop) -> Iterator[Reply]:
        waiting = iter(jobs)
        held: Job | None = None  # a job taken that did not fit the last prompt decode
        running: dict[int, RunningReply] = {}
        free = list(range(self.slots - 1, -1, -1))
        # Prompts are fed in decodes of their own: llama.cpp splits a batch whose sequences
        # bring different numbers of tokens into one sub-batch per shape, so a prompt mixed
        # into the one-token steps of the others would cut each step into pieces. New
        # sequences start when an eighth of the slots is free, a prompt decode for several.
        refill_at = max(1, self.slots // 8)
        steps: list[tuple[int, int, int, bool]] = []  # (token, position, slot, wants logits)
        exhausted = False
        while True:
            prompts: list[tuple[int, int, int, bool]] = []
            if not exhausted and (len(free) >= refill_at or not running):
                while free:
                    job, held = held or next(waiting, None), None
                    if job is None:
                        exhausted = True
                        break
                    check_prompt_fits(job.prompt_ids, self.sequence_tokens, max_new_tokens)
                    if len(prompts) + len(job.prompt_ids) > self.batch_tokens:
                        held = job  # it starts in the next prompt decode
                        break
                    slot = free.pop()
                    self._llama.llama_memory_seq_rm(self._memory, slot, -1, -1)
                    running[slot] = RunningReply(job, position=len(job.prompt_ids))
                    last = len(job.prompt_ids) - 1
                    prompts += [(token, index, slot, index == last) for index, token in enumerate(job.prompt_ids)]
            if not prompts and not steps:
                return
            following: list[tuple[int, int, int, bool]] = []
            for queued in (prompts, steps):
                if not queued:
                    continue
                if should_stop():
                    return
                # In slot order: llama.cpp puts only consecutive sequences into one sub-batch
                # when each has a KV stream of its own (~3.5× slower steps out of order).
                queued.sort(key=lambda entry: entry[2])
                slots = self._decode(queued)
                logits = torch.from_numpy(np.ctypeslib.as_array(self._llama.llama_get_logits(self._context), shape=(len(slots), self.vocab_size)))
                for slot, token in zip(slots, sample_next(logits, [running[slot] for slot in slots], temperature, stored_top_k)):
                    state = running[slot]
                    finished = state.add(token, stop_ids, max_new_tokens)
                    if finished is not None:
                        del running[slot]
                        free.append(slot)
                        yield finished
                    else:
                        following.append((token, state.position, slot, True))
                        state.position += 1
            steps = following

    def _decode(self, queued: list[tuple[int, int, int, bool]]) -> list[int]:
        """Run one decode; returns the slot of each logits row, in row order."""
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
