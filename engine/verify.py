"""Exact verification of a drafted chain: which draft tokens the target keeps, and the one
token it adds after them. Pure functions over distributions (ALGORITHMS.md §1–2).

Shapes: K draft tokens; `draft_probs` (K, V) holds the distribution each draft token was
sampled from; `target_probs` (K+1, V) holds the target's distribution after the committed
prefix and after each draft token.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .sampling import Sampler


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens, from the start, the target keeps
    next_token: int  # the target's own token after them (correction or bonus)


# The one signature every chain verifier has: (draft tokens, the (K, V) distributions they
# were drawn from or None for point masses, the target's (K+1, V) logits, the sampler) ->
# Verdict. Decoding rounds take one and never ask which it is.
ChainVerifier = Callable[[list[int], "torch.Tensor | None", torch.Tensor, Sampler], "Verdict"]


def exact_verifier(kind: str = "block") -> ChainVerifier:
    """Exact verification: greedy agreement at temperature 0; otherwise block verification
    ("block") or token-level speculative sampling ("token")."""
    rule = verify_block if kind == "block" else verify_token_level

    def verify(draft_tokens: list[int], draft_probs: torch.Tensor | None, target_logits: torch.Tensor, sampler: Sampler) -> Verdict:
        if sampler.greedy:
            return verify_greedy(draft_tokens, target_logits)
        target_probs = sampler.probabilities(target_logits)
        if draft_probs is None:
            draft_probs = one_hot_rows(draft_tokens, target_probs.shape[-1])
        return rule(draft_tokens, draft_probs, target_probs, sampler)

    return verify


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> Verdict:
    """Keep draft tokens while they equal the target's argmax; then add the target's argmax."""
    target_best = torch.argmax(target_logits, dim=-1).tolist()  # (K+1,)
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == target_best[accepted]:
        accepted += 1
    return Verdict(accepted, target_best[accepted])


def verify_token_level(
    draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor, sampler: Sampler
) -> Verdict:
    """Speculative sampling: accept X_i with probability min(1, p(X_i)/q(X_i)); at the first
    rejection draw from norm(max(p - q, 0)); if all pass, draw the bonus from p_{K+1}."""
    for i, token in enumerate(draft_tokens):
        ratio = float(target_probs[i, token]) / float(draft_probs[i, token])
        if sampler.uniform() >= min(1.0, ratio):
            return Verdict(i, sampler.draw(_residual(target_probs[i], draft_probs[i], 1.0)))
    return Verdict(len(draft_tokens), sampler.draw(target_probs[len(draft_tokens)]))


def verify_block(
    draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor, sampler: Sampler
) -> Verdict:
    """Block verification (Sun et al., arXiv 2403.10444): the longest prefix whose fresh
    uniform passes its threshold h_i wins, and the residual is weighted by that prefix's
    acceptance weight p_tau. Never accepts fewer tokens on average than token-level."""
    k = len(draft_tokens)
    weight = 1.0  # p_i in the paper, carried as a float64 Python scalar
    weights = [1.0]
    accepted = 0
    for i, token in enumerate(draft_tokens, start=1):
        ratio = float(target_probs[i - 1, token]) / float(draft_probs[i - 1, token])
        weight = min(1.0, weight * ratio)
        weights.append(weight)
        if i < k:
            leftover = float(torch.clamp(weight * target_probs[i].double() - draft_probs[i].double(), min=0).sum())
            denominator = leftover + 1.0 - weight
            threshold = leftover / denominator if denominator > 0 else 1.0
        else:
            threshold = weight
        # No early exit: a later position that passes overrides an earlier failure.
        if sampler.uniform() <= threshold:
            accepted = i
    if accepted == k:
        return Verdict(k, sampler.draw(target_probs[k]))
    residual = _residual(target_probs[accepted], draft_probs[accepted], weights[accepted])
    return Verdict(accepted, sampler.draw(residual))


def _residual(target_row: torch.Tensor, draft_row: torch.Tensor, weight: float) -> torch.Tensor:
    """norm(max(weight * p - q, 0)); falls back to p where rounding left no mass at all."""
    leftover = torch.clamp(weight * target_row.double() - draft_row.double(), min=0)
    total = float(leftover.sum())
    if total <= 0:
        return target_row
    return (leftover / total).float()


def one_hot_rows(tokens: list[int], vocab_size: int) -> torch.Tensor:
    """(K, V) point masses: the distributions of a drafter that proposes deterministically."""
    rows = torch.zeros(len(tokens), vocab_size)
    if tokens:
        rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return rows
