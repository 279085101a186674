"""A trigram model with backoff: the cheap second-stage drafter (ALGORITHMS.md §3b).

Counts come from two places: a background table built offline from text the draft model
wrote (shipped for the demo pair), and the conversation itself, whose counts weigh more
because a reply often repeats its own context. Probabilities use interpolated absolute
discounting, so every history's distribution sums to one over the whole vocabulary:

    P(w | h) = max(c(h, w) - D, 0) / c(h) + D * n(h) / c(h) * P(w | shorter h)

with n(h) the number of distinct tokens seen after h, down to an add-one unigram.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from ..sampling import Sampler
from .base import ChainDrafter, Proposal

ORDER = 3  # trigram: histories of up to two tokens
DISCOUNT = 0.75
CONVERSATION_WEIGHT = 4  # one token seen in this conversation counts as much as four in the table
TABLE_FILE = "ngram-table.npz"  # a draft folder's background table, when it ships one


class NgramCounts:
    """Counts of each token after each history of 0..ORDER-1 tokens."""

    def __init__(self) -> None:
        self.after: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)

    def add(self, tokens: list[int], start: int = 0, weight: int = 1) -> None:
        """Count every token from index `start` on, after each of its histories."""
        for index in range(max(start, 0), len(tokens)):
            for length in range(0, ORDER):
                if index - length < 0:
                    break
                self.after[tuple(tokens[index - length : index])][tokens[index]] += weight

    def save(self, path: Path) -> None:
        """Compact form: one int32 row (h1, h2, token, count) per entry, -1 for an absent
        history slot."""
        rows = [
            (*(history + (-1,) * (ORDER - 1 - len(history)))[: ORDER - 1], token, count)
            for history, counter in self.after.items()
            for token, count in counter.items()
        ]
        np.savez_compressed(path, rows=np.asarray(rows, dtype=np.int32).reshape(-1, ORDER + 1))

    @classmethod
    def load(cls, path: Path) -> NgramCounts:
        counts = cls()
        rows = np.load(path)["rows"]
        for *history, token, count in rows.tolist():
            counts.after[tuple(h for h in history if h >= 0)][token] = count
        return counts

    def prune(self, min_count: int) -> None:
        """Drop the rare entries of histories longer than one token: they make the table big
        and predict little."""
        for history in list(self.after):
            if len(history) < 2:
                continue
            counter = self.after[history]
            for token in [t for t, c in counter.items() if c < min_count]:
                del counter[token]
            if not counter:
                del self.after[history]


class BackoffNgram:
    """Background table plus the running conversation, as one backoff trigram model."""

    def __init__(self, vocab_size: int, background: NgramCounts | None = None):
        self.vocab_size = vocab_size
        self.background = background or NgramCounts()
        self.conversation = NgramCounts()
        self._counted: list[int] = []
        self._background_best: dict[tuple[int, ...], int | None] = {}

    def observe(self, context: list[int]) -> None:
        """Bring the conversation counts up to `context`: new tokens are added; if the context
        no longer extends what was counted (a new chat), counting starts over."""
        if context[: len(self._counted)] != self._counted:
            self.conversation = NgramCounts()
            self._counted = []
        self.conversation.add(context, start=len(self._counted), weight=CONVERSATION_WEIGHT)
        self._counted = list(context)

    def _counter(self, history: tuple[int, ...]) -> Counter[int]:
        merged = Counter(self.background.after.get(history, ()))
        merged.update(self.conversation.after.get(history, {}))
        return merged

    def probability(self, history: tuple[int, ...], token: int) -> float:
        history = history[len(history) - (ORDER - 1) :] if len(history) > ORDER - 1 else history
        unigram = self._counter(())
        probability = (unigram[token] + 1) / (sum(unigram.values()) + self.vocab_size)
        for length in range(1, len(history) + 1):
            counter = self._counter(history[len(history) - length :])
            total = sum(counter.values())
            if total == 0:
                continue
            probability = max(counter[token] - DISCOUNT, 0) / total + DISCOUNT * len(counter) / total * probability
        return probability

    def propose(self, context: list[int], max_tokens: int) -> list[int]:
        """The most likely continuation, token by token, while the longest history seen
        before (at least one token long) predicts it; nothing from unseen histories."""
        self.observe(context)
        tokens: list[int] = []
        history = list(context[-(ORDER - 1) :])
        while len(tokens) < max_tokens:
            best = self._best_next(tuple(history))
            if best is None:
                break
            tokens.append(best)
            history = (history + [best])[-(ORDER - 1) :]
        return tokens

    def _best_next(self, history: tuple[int, ...]) -> int | None:
        """The most frequent token after the longest known history (its discounted count
        dominates the backoff terms there); ties go to the lowest id, for determinism."""
        for length in range(len(history), 0, -1):
            suffix = history[len(history) - length :]
            background = self.background.after.get(suffix, {})
            conversation = self.conversation.after.get(suffix, {})
            # Only the table's own favourite or a token seen in this conversation can win, so
            # a long table row is scanned once, not every round.
            candidates = set(conversation)
            favourite = self._table_favourite(suffix)
            if favourite is not None:
                candidates.add(favourite)
            if candidates:
                return max(candidates, key=lambda t: (background.get(t, 0) + conversation.get(t, 0), -t))
        return None

    def _table_favourite(self, history: tuple[int, ...]) -> int | None:
        if history not in self._background_best:
            row = self.background.after.get(history)
            self._background_best[history] = max(row.items(), key=lambda item: (item[1], -item[0]))[0] if row else None
        return self._background_best[history]

    def reset(self) -> None:
        self.conversation = NgramCounts()
        self._counted = []


class BackoffNgramDrafter(ChainDrafter):
    """The backoff n-gram model alone as a chain drafter: method `ngram`. Its proposals are
    deterministic (point masses), which speculative sampling verifies exactly too."""

    name = "backoff n-gram"

    def __init__(self, model: BackoffNgram, draft_tokens: int):
        super().__init__(draft_tokens)
        self.model = model

    def propose_chain(self, context: list[int], max_tokens: int, sampler: Sampler) -> Proposal:
        return Proposal.chain(context, self.model.propose(context, max_tokens))

    def reset(self) -> None:
        self.model.reset()
