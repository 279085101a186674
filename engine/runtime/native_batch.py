"""Many sequences at once on the native int8 forward (`SequenceBatch`): continuous batching
where a target runs natively on the CPU (native_forward.py), distillation's way of writing
its replies there.

Each of `slots` sequences owns `sequence_tokens` rows of one KV cache. One forward
(`NativeForward.spans`) runs the next token of every running sequence together with the
prompts of those that start, each token attending over its own sequence's rows only: the
weights are read, and the int8 kernel's tile products fed, once for all of them, where a
sequence alone pays a whole pass over the weights per token. A released slot takes the next
prompt at the next forward, so short replies never leave the batch half idle.

A token gets the logits a runtime holding its sequence alone gives it, to the bit (test).

Measured on the 2-core development CPU (docs/bench/reply_writers.py: the demo target, 48 of the
shipped distillation prompts, T = 0.7, up to 256 new tokens): 534 / 625 / 642 reply tokens/s
at 32 / 64 / 128 slots, against 86 for llama.cpp's continuous batching over the F16 file at
128 slots: 7.3x.
"""
from __future__ import annotations

import torch

from .native_forward import NativeForward, native_forward, refusal
from .static_cache_forward import StaticCacheForward

# Prompt tokens one forward takes beside the running sequences' steps: a forward of many more
# tokens than slots keeps every running reply waiting on prompts.
PROMPT_TOKENS_PER_FORWARD = 256

Token = tuple[int, int, int]  # (slot, token, position)


class NativeSequenceBatch:
    """Up to `slots` sequences of up to `sequence_tokens` tokens (prompt included) of an int8
    `model` on the CPU; ValueError for a model the native forward cannot run."""

    def __init__(self, model: torch.nn.Module, device: torch.device, slots: int, sequence_tokens: int):
        reason = refusal(model, device)
        if reason is not None:
            raise ValueError(f"the native forward cannot run this model: {reason}")
        self.slots = slots
        self.sequence_tokens = sequence_tokens
        # float32 keys and values for every slot: rows the sequences never reach stay untouched pages
        self._forward: NativeForward | None = native_forward(StaticCacheForward(model, slots * sequence_tokens, device))
        self._positions: dict[int, int] = {}  # running slot -> the position of its next token
        self._starting: list[tuple[int, list[int]]] = []  # (slot, prompt) started since the last step
        self._prompt_tokens = 0  # how many tokens those prompts hold

    def close(self) -> None:
        self._forward = None  # the cache is freed with it

    # The contract

    def can_start(self) -> bool:
        return self._prompt_tokens < PROMPT_TOKENS_PER_FORWARD

    def fits(self, prompt_length: int) -> bool:
        return True  # the forward takes the prompt that passes the mark too

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        self._starting.append((slot, prompt_ids))
        self._prompt_tokens += len(prompt_ids)
        self._positions[slot] = len(prompt_ids)

    def step(self, next_tokens: list[tuple[int, int]]) -> tuple[list[int], torch.Tensor]:
        """One forward over the starting sequences' prompts and the running ones' tokens. The
        prompts' tokens but the last come first: logits are computed only from `wanted_from` on."""
        if self._forward is None:
            raise ValueError("this sequence batch was closed")
        unwanted: list[Token] = []
        wanted: list[Token] = []
        for slot, prompt in self._starting:
            unwanted += [(slot, token, position) for position, token in enumerate(prompt[:-1])]
            wanted.append((slot, prompt[-1], len(prompt) - 1))
        for slot, token in next_tokens:
            wanted.append((slot, token, self._positions[slot]))
            self._positions[slot] += 1
        self._starting, self._prompt_tokens = [], 0
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

    def release(self, slot: int) -> None:
        del self._positions[slot]
