"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
context's last n tokens. Free to run and strong on replies that quote the conversation."""
from __future__ import annotations

from ..sampling import Sampler
from .base import ChainDrafter, Proposal


class NgramDrafter(ChainDrafter):
    name = "n-gram prompt lookup"

    def __init__(self, draft_tokens: int, max_ngram: int = 3, min_ngram: int = 1):
        super().__init__(draft_tokens)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose_chain(self, context: list[int], max_tokens: int, sampler: Sampler) -> Proposal:
        # Longer matches first: they predict the continuation more reliably.
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            continuation = _continuation_of_latest_match(context, n, max_tokens)
            if continuation:
                return Proposal.chain(context, continuation)
        return Proposal.chain(context, [])


def _continuation_of_latest_match(context: list[int], n: int, max_tokens: int) -> list[int]:
    suffix = context[-n:]
    # Scan backwards so the most recent occurrence wins; skip the suffix itself.
    for start in range(len(context) - n - 1, -1, -1):
        if context[start : start + n] == suffix:
            return context[start + n : start + n + max_tokens]
    return []
