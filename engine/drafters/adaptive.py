"""SpecDec++'s stop rule (ALGORITHMS.md §5): keep drafting while the acceptance head thinks
the whole draft so far is likely to be accepted. Verification stays exact: the rule only
decides how many tokens the target is asked to check."""
from __future__ import annotations

import torch

from ..heads.features import head_features
from ..heads.store import DraftHeads, mode_for
from ..runtime import ModelRuntime
from ..sampling import Sampler


class AdaptiveLength:
    """Stop once 1 - Π P̂(token i accepted) exceeds `threshold` (the paper's h)."""

    unchecked = 0  # exact: the target checks every drafted token

    def __init__(self, heads: DraftHeads, sampler: Sampler, threshold: float):
        self.heads = heads
        self.mode = mode_for(sampler.greedy)
        self.threshold = threshold
        self.all_accepted = 1.0  # predicted probability that every token so far is accepted

    def stop_after(self, token: int, probs: torch.Tensor, draft: ModelRuntime) -> bool:
        hidden = draft.last_hidden_states()[-1:]  # the state that produced `token`'s logits
        features = head_features(hidden, probs[None], torch.tensor([token]))[0]
        self.all_accepted *= self.heads.acceptance(self.mode, features)
        return 1.0 - self.all_accepted > self.threshold
