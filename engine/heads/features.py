"""What a head sees of one drafted token: the draft's final-norm hidden state at the position
that produced it, and three numbers about the distribution it was drawn from.

The hidden state alone does not say *which* token was drawn: when sampling, the draft may
draw a token it gave 5%. Its own probability of that token, its best probability and its
entropy say how sure the draft was, at no cost (the distribution is already computed).
"""
from __future__ import annotations

import torch

EXTRA_FEATURES = 3


def head_features(hidden: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(N, D) hidden states, (N, V) draft distributions, (N,) drawn tokens -> (N, D + 3)."""
    probs = draft_probs.float()
    chosen = probs.gather(-1, tokens.long()[:, None]).clamp_min(1e-12)  # (N, 1)
    best = probs.max(dim=-1, keepdim=True).values.clamp_min(1e-12)
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1, keepdim=True)
    return torch.cat([hidden.float(), chosen.log(), best.log(), entropy], dim=-1)
