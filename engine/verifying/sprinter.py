"""SPRINTER (ALGORITHMS.md §4, seed 000): approximate verification.

The draft writes token by token and a learned verifier scores each token from the draft's
hidden state (`SprinterGate`, the draft's stop rule). Tokens it passes go out without the
target ever seeing them; the first token it flags makes the target run once over everything
it has not cached yet, and only that token is checked, by the exact verifier
(`sprinter_verifier`). The unflagged tokens are the approximation: each is the draft's token
where the target would have rejected it with probability η, the verifier's false-positive
rate, so the output drifts from the target's distribution by η·d_TV(p, q) per unchecked
token. Replies mark those tokens UNCHECKED.
"""
from __future__ import annotations

import torch

from ..drafters.base import Proposal
from ..heads.features import head_features
from ..heads.store import DraftHeads, mode_for
from ..round import Verifier
from ..runtime import ModelRuntime
from ..sampling import Sampler
from ..tree import TokenTree, TreeVerdict


class SprinterGate:
    """The draft's stop rule under SPRINTER: go on while the verifier passes each token;
    stop at the first one it flags (that one the target checks)."""

    def __init__(self, heads: DraftHeads, sampler: Sampler):
        self.heads = heads
        self.mode = mode_for(sampler.greedy)
        self.unchecked = 0

    def stop_after(self, token: int, probs: torch.Tensor, draft: ModelRuntime) -> bool:
        hidden = draft.last_hidden_states()[-1:]  # the state that produced `token`'s logits
        features = head_features(hidden, probs[None], torch.tensor([token]))[0]
        if not self.heads.passes(self.mode, features):
            return True
        self.unchecked += 1
        return False


def sprinter_verifier(exact: Verifier) -> Verifier:
    """Pass the proposal's unchecked tokens as they are; check the flagged one after them
    with `exact` (the target's logits start at the last unchecked token)."""

    def verify(proposal: Proposal, target_logits: torch.Tensor | None, sampler: Sampler) -> TreeVerdict:
        unchecked = proposal.unchecked
        passed = list(range(1, unchecked + 1))
        if target_logits is None:  # every drafted token passed: no target call
            return TreeVerdict(passed, None)
        verdict = exact(_checked_part(proposal), target_logits, sampler)
        return TreeVerdict(passed + [unchecked + node for node in verdict.path], verdict.next_token)

    return verify


def _checked_part(proposal: Proposal) -> Proposal:
    """The chain from the last unchecked token on, as a proposal of its own."""
    unchecked, tokens = proposal.unchecked, proposal.tree.tokens
    probs = proposal.draft_probs[unchecked:] if proposal.draft_probs is not None else None
    return Proposal(TokenTree.chain(tokens[unchecked], tokens[unchecked + 1:]), probs)
