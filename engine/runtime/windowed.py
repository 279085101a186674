"""A draft that reads only the end of a long prompt, behind the runtime contract.

Why: a draft model proposes the next few tokens, and what it needs for that is the recent
text, not a whole pasted document. Reading all of a long message costs it the same
attention a target pays, a little of it per layer: the demo draft (4 layers) read a 7,000-token
prompt in 2.2 s on 2 cores, time the user spent waiting for the first token, and every draft
call after that attended to all 7,000 tokens again (1.9 ms a call, against 1.1 ms over the
window). The target still reads everything, and
decoding stays exact: a verifier accepts or rejects whatever the draft proposes, so a draft
that saw less can only be accepted less often (docs/BENCHMARKS.md measures by how much).

How: `WindowedRuntime` presents the full context's slots to the algorithms, but the slots
before `offset` are only bookkeeping; `inner` caches the tokens from `offset` on, at its own
positions 0, 1, ... (rotary attention depends on the distance between tokens only, so the
window's tokens attend to one another as they would at their real positions). The window is
chosen when a read would be long: `pending` asked for more than `window` new tokens starts
the inner cache afresh at the last `window` of them (as does a crop that left the inner cache
empty). A conversation that grows a message at a time keeps its cache, as before.
"""
from __future__ import annotations

import torch

from .base import ModelRuntime
from .wrapped import WrappedRuntime

# The tokens a draft reads of a long prompt. With 2,048, the demo draft read a 7,000-token
# message in 0.35 s (2.19 s whole) and kept as many tokens per target call as with all of it;
# with 1,024 it kept fewer on a 2,000-token message (2.00 against 2.13, docs/BENCHMARKS.md).
DRAFT_WINDOW_TOKENS = 2048


class WindowedRuntime(WrappedRuntime):
    """`inner` holds slots `offset`.. of this runtime's cache, as its own slots 0..; the
    slots before `offset` are context the draft does not attend to."""

    def __init__(self, inner: ModelRuntime, window: int):
        if window < 1:
            raise ValueError("a draft's window must hold at least one token")
        super().__init__(inner, inner.vocab_size)
        self.window = window
        self.offset = 0

    def pending(self, context: list[int]) -> list[int]:
        rest = super().pending(context)
        emptied = self.offset > 0 and len(self.inner) == 0  # cropped to text it never attended to
        if len(rest) - 1 <= self.window and not emptied:
            return rest
        # A long read, or nothing of the window left (an earlier message edited): the draft
        # starts over at the window before the last token, from the start if the text is short.
        start = max(0, len(context) - 1 - self.window)
        self.reset()
        self.cached_ids = list(context[:start])
        self._reset_chain_bookkeeping()
        self.offset = start
        return context[start:]

    def first_attended_slot(self) -> int:
        return self.offset

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        return self.inner.forward(new_ids, logits_wanted)

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        return self.inner.forward_tree(new_ids, [self._inner_parent(parent) for parent in parents], logits_wanted)

    def _inner_parent(self, parent: int) -> int:
        # The slot just before the window is the inner cache's "nothing before": a token
        # following it starts the inner chain.
        if parent < self.offset - 1:
            raise ValueError("a draft token cannot follow a slot outside the draft's window")
        return parent - self.offset if parent >= self.offset else -1

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        if prefix < self.offset:
            # Cropped into the text before the window (an earlier message edited): the inner
            # cache holds nothing of what stays, and the window starts where the text now ends.
            self.inner.reset()
            self.offset = prefix + len(extra_slots)
            return
        self.inner.keep_slots(prefix - self.offset, [slot - self.offset for slot in extra_slots])

    def _clear(self) -> None:
        self.inner.reset()
        self.offset = 0
