"""Many target replies at once on the native int8 forward: continuous batching for
distillation data where the target runs natively on the CPU (engine/runtime/native_forward.py).

Each of `slots` sequences owns `sequence_tokens` rows of one KV cache. One forward
(`NativeForward.spans`) runs the next token of every running reply together with the prompts
of the replies that start, each token attending over its own sequence's rows only: the weights
are read, and the int8 kernel's tile products fed, once for all of them, where a reply alone
pays a whole pass over the weights per token. A reply that ends frees its slot for the next
prompt at the next forward, so short replies never leave the batch half idle.

A token gets the logits a runtime holding its sequence alone gives it, to the bit (test):
these replies are the ones chats would sample, from the int8 target that chats run.

Measured on the 2-core development CPU (docs/bench/reply_writers.py: the demo target, 48 of the
shipped distillation prompts, T = 0.7, up to 256 new tokens): 534 / 625 / 642 reply tokens/s
at 32 / 64 / 128 slots, against 86 for llama.cpp's continuous batching over the F16 file at
128 slots, the writer used here before: 7.3x.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from ...models import LoadedModel
from ...runtime.native_forward import NativeForward, native_forward, refusal
from ...runtime.torch_static import StaticCacheForward
from .replies import Job, Reply, RunningReply, check_prompt_fits, sample_next

# Prompt tokens one forward takes beside the running replies' steps: a forward of many more
# tokens than slots keeps every running reply waiting on prompts.
PROMPT_TOKENS_PER_FORWARD = 256


def native_refusal(target: LoadedModel) -> str | None:
    """Why the target's replies cannot be written here; None when they can."""
    if target.model is None:
        return f"{target.label} runs on {target.runtime}, not on torch"
    return refusal(target.model, target.device)


class NativeBatchWriter:
    """Up to `slots` replies of up to `sequence_tokens` tokens (prompt included) at once;
    `owns_target`: closing the writer closes the target too."""

    def __init__(self, target: LoadedModel, slots: int, sequence_tokens: int, owns_target: bool = False):
        reason = native_refusal(target)
        if reason is not None:
            raise ValueError(f"the native forward cannot write {target.label}'s replies: {reason}")
        self.slots = slots
        self.sequence_tokens = sequence_tokens
        self._target = target if owns_target else None
        # float32 keys and values for every slot: rows the replies never reach stay untouched pages
        self._forward: NativeForward | None = native_forward(StaticCacheForward(target.model, slots * sequence_tokens, target.device))

    def close(self) -> None:
        self._forward = None  # the cache is freed with it
        if self._target is not None:
            self._target.close()
            self._target = None

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
        if self._forward is None:
            raise ValueError("this reply writer was closed")
        waiting = iter(jobs)
        running: dict[int, RunningReply] = {}
        free = list(range(self.slots - 1, -1, -1))
        steps: list[tuple[int, int]] = []  # (slot, token): each running reply's last token
        while True:
            starting: list[int] = []
            prompt_tokens = 0
            while free and prompt_tokens < PROMPT_TOKENS_PER_FORWARD:
                job = next(waiting, None)
                if job is None:
                    break
                check_prompt_fits(job.prompt_ids, self.sequence_tokens, max_new_tokens)
                slot = free.pop()
                running[slot] = RunningReply(job, position=len(job.prompt_ids))
                starting.append(slot)
                prompt_tokens += len(job.prompt_ids)
            if not starting and not steps:
                return
            if should_stop():
                return
            wanted_slots, logits = self._forward_once(starting, steps, running)
            following = []
            for slot, token in zip(wanted_slots, sample_next(logits, [running[slot] for slot in wanted_slots], temperature, stored_top_k)):
                finished = running[slot].add(token, stop_ids, max_new_tokens)
                if finished is not None:
                    del running[slot]
                    free.append(slot)
                    yield finished
                else:
                    following.append((slot, token))
            steps = following

    def _forward_once(
        self, starting: list[int], steps: list[tuple[int, int]], running: dict[int, RunningReply]
    ) -> tuple[list[int], torch.Tensor]:
        """One forward over the starting replies' prompts and the running ones' last tokens;
        returns the slots that get a next token, with their logits rows. The prompts' tokens
        but the last come first: logits are computed only from `wanted_from` on."""
        unwanted: list[tuple[int, int, int]] = []  # (slot, token, position)
        wanted: list[tuple[int, int, int]] = []
        for slot in starting:
            prompt = running[slot].job.prompt_ids
            unwanted += [(slot, token, position) for position, token in enumerate(prompt[:-1])]
            wanted.append((slot, prompt[-1], len(prompt) - 1))
        for slot, token in steps:
            state = running[slot]
            wanted.append((slot, token, state.position))
            state.position += 1
        tokens = unwanted + wanted
        first_rows = [slot * self.sequence_tokens for slot, _, _ in tokens]
        logits, _ = self._forward.spans(
            ids=[token for _, token, _ in tokens],
            positions=[position for _, _, position in tokens],
            rows=[first + position for first, (_, _, position) in zip(first_rows, tokens)],
            span_first=first_rows,
            span_rows=[position + 1 for _, _, position in tokens],
            wanted_from=len(unwanted),
        )
        return [slot for slot, _, _ in wanted], logits
