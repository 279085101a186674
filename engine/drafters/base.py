"""The interface every drafter implements, so the decoding loop never asks which one it has."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..sampling import Sampler
from ..verify import one_hot_rows


@dataclass(frozen=True)
class DraftProposal:
    """Up to K tokens to continue the context, and how they were chosen.

    `probs` (K, V) holds the distribution each token was drawn from; None means the drafter
    chose deterministically (a point mass on each token), which speculative sampling
    handles exactly too.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    forward_calls: int = 0

    def distributions(self, vocab_size: int) -> torch.Tensor:
        return self.probs if self.probs is not None else one_hot_rows(self.tokens, vocab_size)


class Drafter(ABC):
    name: str = "drafter"

    @abstractmethod
    def propose(self, context: list[int], max_tokens: int, sampler: Sampler) -> DraftProposal:
        """Propose up to `max_tokens` tokens to follow `context` (the committed tokens)."""

    def reset(self) -> None:
        """Forget per-conversation state (caches, tables)."""


class NoDrafter(Drafter):
    """Proposes nothing: every round is one plain target step. This is `ar`, run through
    exactly the same cache and verification machinery as speculative decoding."""

    name = "none"

    def propose(self, context: list[int], max_tokens: int, sampler: Sampler) -> DraftProposal:
        return DraftProposal([])
