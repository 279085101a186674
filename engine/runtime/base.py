"""The contract every runtime implements: a model with its KV cache, run incrementally.

Decoding algorithms (chain, tree, staged and every verifier) talk to models only through
`ModelRuntime`, so a runtime (torch eager, llama.cpp, a graph-captured one) is one module
behind it, never an `if` inside an algorithm.

The cache is a list of *slots*, one per token it holds, in the order the tokens were run.
Every slot has a parent slot: the token it follows. The committed context is a chain (slot
i follows slot i - 1); a token tree adds branches whose parents are earlier slots. A token
attends to itself and its ancestors only, at position = its depth along that chain. After a
tree is verified, `keep_slots` keeps the accepted path and the cache is a chain again.

A runtime opened with `feature_layers` also keeps, per slot, the residual stream entering
those layers (what an EAGLE-3 head drafts from): `features`, compacted with the cache.

`SequenceBatch` is the second contract, for writing many independent replies at once
(distillation data): sequences in numbered slots, one step feeding each its next token.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

import torch


class ModelRuntime(ABC):
    """A causal LM and its cache. Logits come back as float32 torch tensors on the host or
    device the model runs on, whatever the runtime computes them with."""

    #: short name shown to the user ("torch", "llama.cpp")
    name: str = "runtime"
    #: whether branches (`forward_tree`, `keep_slots` over a tree) are supported
    supports_trees: bool = True
    #: whether `last_hidden_states` works: set by a runtime opened with hidden states, which
    #: learned heads on a draft (SPRINTER's verifier, SpecDec++'s stop rule) read
    returns_hidden: bool = False
    #: layers whose inputs it records for every slot (`features`); empty: none
    feature_layers: tuple[int, ...] = ()

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.cached_ids: list[int] = []
        self.slot_parents: list[int] = []  # slot -> the slot it follows (-1 for the first)
        self.slot_positions: list[int] = []  # slot -> its position (depth along its chain)
        self.chain_length = 0  # the leading slots that form one causal chain
        self.forward_calls = 0
        self._features: torch.Tensor | None = None  # (capacity, F): slot -> its features

    def __len__(self) -> int:
        return len(self.cached_ids)

    # What a runtime implements

    @abstractmethod
    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        """Append `new_ids` causally after the whole cache, which is a chain; return
        (logits_wanted, V) float32 logits for the last `logits_wanted` of them."""

    @abstractmethod
    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        """Append `new_ids`, token i following slot `parents[i]` at `positions[i]`; the slot
        bookkeeping (`slot_parents`, `slot_positions`) does not include them yet."""

    @abstractmethod
    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        """Physically keep slots [0, prefix) and then `extra_slots`, a path continuing the
        prefix; drop everything else."""

    @abstractmethod
    def _clear(self) -> None:
        """Drop every cached token."""

    def _last_features(self) -> torch.Tensor:
        """(T, F) float: the `feature_layers` inputs of every token the last run appended,
        concatenated layer after layer (runtimes that record features implement it)."""
        raise ValueError(f"this {self.name} runtime cannot record layer features")

    # The contract the algorithms use

    def forward(self, new_ids: list[int], logits_wanted: int = 1) -> torch.Tensor:
        """Append `new_ids` after the cached chain; return float32 logits (logits_wanted, V)
        for the last `logits_wanted` of them (the LM head over a whole prompt is costly)."""
        if self.chain_length != len(self):
            raise ValueError("a causal forward needs a cache without branches; keep a path first")
        start = len(self)
        logits = self._guarded(lambda: self._run_chain(new_ids, logits_wanted))
        self._append(new_ids, list(range(start - 1, start - 1 + len(new_ids))), list(range(start, start + len(new_ids))))
        self._record_features(start)
        self.chain_length = len(self)
        return logits

    def forward_tree(self, new_ids: list[int], parents: list[int], logits_wanted: int) -> torch.Tensor:
        """Append `new_ids` where token i follows slot `parents[i]`: a cached slot, or an
        earlier new token (slot len(self) + j). Each token sees its ancestors and itself.
        This is how a token tree runs in one forward. Returns float32 logits for the last
        `logits_wanted` tokens."""
        start = len(self)
        positions = []
        for index, parent in enumerate(parents):
            if not -1 <= parent < start + index or (parent == -1 and start + index > 0):
                raise ValueError("every new token must follow an earlier slot")
            positions.append(self._position_of(parent, start, positions) + 1)
        logits = self._guarded(lambda: self._run_tree(new_ids, parents, positions, logits_wanted))
        self._append(new_ids, parents, positions)
        self._record_features(start)
        if self.chain_length == start:  # new tokens that just continue the chain extend it
            while self.chain_length < len(self) and self.slot_parents[self.chain_length] == self.chain_length - 1:
                self.chain_length += 1
        return logits

    def keep_slots(self, prefix: int, extra_slots: list[int]) -> None:
        """Compact the cache to its first `prefix` slots followed by `extra_slots` (a path of
        slots continuing the prefix): a verified tree path keeps its keys and values, the
        rejected branches are dropped, and nothing is recomputed. A cache that never held
        `prefix` slots (a draft that sat a round out) keeps what it has."""
        if not extra_slots and prefix >= len(self):
            return
        if prefix > self.chain_length:
            raise ValueError("the kept prefix must be part of the cached chain")
        if extra_slots != sorted(extra_slots) or any(slot < prefix for slot in extra_slots):
            raise ValueError("extra slots must be ascending and lie past the prefix")
        follows = prefix - 1
        for slot in extra_slots:
            if self.slot_parents[slot] != follows:
                raise ValueError("the extra slots must form a path that continues the prefix")
            follows = slot
        self._guarded(lambda: self._keep(prefix, extra_slots))
        if self._features is not None and extra_slots:
            self._features[prefix : prefix + len(extra_slots)] = self._features[torch.tensor(extra_slots)]
        self.cached_ids = self.cached_ids[:prefix] + [self.cached_ids[slot] for slot in extra_slots]
        self._reset_chain_bookkeeping()

    def crop(self, length: int) -> None:
        """Forget every cached slot from `length` on."""
        if length >= len(self):
            return
        if length > self.chain_length:
            raise ValueError("cannot crop into a token tree; keep a path with keep_slots")
        self.keep_slots(length, [])

    def last_hidden_states(self) -> torch.Tensor:
        """(N, D) float32: the final-norm hidden states of the N tokens the last forward
        returned logits for, row for row (the states the LM head turned into those logits)."""
        raise ValueError(f"this {self.name} runtime was opened without hidden states")

    @property
    def features(self) -> torch.Tensor:
        """(len(self), F): each cached slot's `feature_layers` inputs (float32 on the host)."""
        if not self.feature_layers:
            raise ValueError(f"this {self.name} runtime was opened without feature layers")
        if self._features is None:
            return torch.zeros(0, 0)  # nothing has run yet
        return self._features[: len(self)]

    def ready_for(self, context: list[int]) -> bool:
        """Whether this model can run on `context` now (an EAGLE-3 head needs the target to
        have read it first); drafters make a plain round when it cannot."""
        return True

    def first_attended_slot(self) -> int:
        """The first cached slot the model attends to: 0, but for a draft that reads only the
        end of a long prompt (windowed.py)."""
        return 0

    def reusable_slots(self) -> int:
        """How many leading cached slots may serve as context for what comes next."""
        return self.chain_length

    def close(self) -> None:
        """Free what the runtime holds outside Python's memory (a llama.cpp context)."""

    #: what `warm_up` does, for the loading progress line (None: nothing to do)
    warm_up_message: str | None = None

    def warm_up(self) -> None:
        """Do once, while a pair loads, the work that would otherwise slow the first reply
        (capturing CUDA graphs, say)."""

    def start_background_work(self) -> None:
        """Start, once the pair is ready, work that makes the runtime faster later without
        holding up a reply (compiling its forward, say); the runtime runs meanwhile."""

    def when_background_work_changes(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (on any thread) when that work ends; never, if there is none."""

    #: what that work means for the user now ("compiling in the background", "compiled"), or None
    background_note: str | None = None

    def reset(self) -> None:
        self._clear()
        self.cached_ids = []
        self._reset_chain_bookkeeping()

    def pending(self, context: list[int]) -> list[int]:
        """Crop the cache to the longest prefix it shares with `context` and return the ids
        of `context` it still lacks. At least the last id is always left pending, since its
        logits are what the caller needs next."""
        shared = 0
        limit = min(self.reusable_slots(), len(context) - 1)
        while shared < limit and self.cached_ids[shared] == context[shared]:
            shared += 1
        self.crop(shared)
        return context[shared:]

    def catch_up(self, context: list[int]) -> None:
        """Cache all of `context` but its last token (whose logits a round still needs), so
        that the round that follows costs what a round costs, whatever the cache missed."""
        pending = self.pending(context)
        if len(pending) > 1:
            self.forward(pending[:-1])

    def logits_for(self, context: list[int], extra: list[int] = ()) -> torch.Tensor:
        """Logits after the last token of `context` and after each of `extra`:
        (1 + len(extra), V), in one forward over whatever the cache lacks."""
        new_ids = self.pending(context) + list(extra)
        return self.forward(new_ids, logits_wanted=1 + len(extra))

    def visible_slots(self, parents: list[int]) -> torch.Tensor:
        """(T, len(self) + T) bool, for T new tokens following `parents` (as in `_run_tree`):
        which slots each new token attends to, its ancestors and itself."""
        past, width = len(self), len(parents)
        visible = torch.zeros(width, past + width, dtype=torch.bool)
        # New tokens that just continue the cached chain (a prompt before its tree) see
        # everything before them: one triangle instead of a row each.
        lead = 0
        if self.chain_length == past:
            while lead < width and parents[lead] == past - 1 + lead:
                lead += 1
        visible[:lead, : past + lead] = torch.ones(lead, past + lead, dtype=torch.bool).tril(past)
        for row, parent in enumerate(parents[lead:], start=lead):
            if parent >= past:
                visible[row] = visible[parent - past]
            elif parent >= 0:
                last_chain_slot, branch = self.ancestors(parent)
                visible[row, : last_chain_slot + 1] = True
                visible[row, branch] = True
            visible[row, past + row] = True
        return visible

    def ancestors(self, slot: int) -> tuple[int, list[int]]:
        """(c, branch): `slot` sees every chain slot up to c and the tree slots in `branch`."""
        branch = []
        while slot >= self.chain_length:
            branch.append(slot)
            slot = self.slot_parents[slot]
        return slot, branch

    # Bookkeeping

    def _position_of(self, parent: int, start: int, new_positions: list[int]) -> int:
        if parent < 0:
            return -1
        return self.slot_positions[parent] if parent < start else new_positions[parent - start]

    def _append(self, new_ids: list[int], parents: list[int], positions: list[int]) -> None:
        self.cached_ids.extend(new_ids)
        self.slot_parents.extend(parents)
        self.slot_positions.extend(positions)
        self.forward_calls += 1

    def _record_features(self, start: int) -> None:
        """Keep the features of the slots from `start` on, which the last run appended."""
        if not self.feature_layers:
            return
        new = self._last_features().float()  # (T, F)
        end = start + new.shape[0]
        if self._features is None or self._features.shape[0] < end:
            grown = torch.zeros(max(end, 2 * (0 if self._features is None else self._features.shape[0]), 256), new.shape[1])
            if self._features is not None:
                grown[:start] = self._features[:start]
            self._features = grown
        self._features[start:end] = new

    def _reset_chain_bookkeeping(self) -> None:
        length = len(self.cached_ids)
        self.slot_parents = list(range(-1, length - 1))
        self.slot_positions = list(range(length))
        self.chain_length = length

    def _guarded(self, run):
        try:
            return run()
        except BaseException:
            # A forward that failed midway (out of memory, say) may have written part of
            # the cache: start from scratch rather than trust any of it.
            self.reset()
            raise


class SequenceBatch(Protocol):
    """Up to `slots` independent sequences decoded together: each `step` feeds every running
    sequence its next token in one call over all of them, so the weights are read once for
    many replies. A sequence's logits are the ones it would get decoded alone; which others
    share its steps changes nothing but the speed. Each runtime implements it beside its
    `ModelRuntime` (torch_batch, native_batch, llamacpp_batch); the reply writer drives it.

    A step: `start` the sequences that begin (while `can_start` and `fits` allow), then
    `step` with the token each running one was given, then `release` those that ended."""

    slots: int  # sequences held at once, numbered 0 .. slots - 1
    sequence_tokens: int  # prompt + reply tokens one sequence may hold

    def can_start(self) -> bool:
        """Whether another sequence may start before the next step: how a runtime paces its
        prompts among the running sequences' steps."""
        ...

    def fits(self, prompt_length: int) -> bool:
        """Whether a prompt this long fits beside those started since the last step (False:
        it starts after the next step)."""
        ...

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        """Begin a sequence in a free `slot`; its prompt runs at the next step."""
        ...

    def step(self, next_tokens: list[tuple[int, int]]) -> tuple[list[int], torch.Tensor]:
        """Run the prompts started since the last step and feed each (slot, token) to that
        running sequence. Returns (slots, logits): the slot of each row of the float32
        (n, V) next-token logits (on the device the model runs on), one row per sequence
        started or fed. They may be the runtime's own buffer: read them before the next step."""
        ...

    def release(self, slot: int) -> None:
        """End the sequence in `slot`; the slot is free for `start` again."""
        ...

    def close(self) -> None:
        """Free what the batch holds (its cache, a llama.cpp context)."""
        ...
