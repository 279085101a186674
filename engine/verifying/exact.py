"""Exact verification (ALGORITHMS.md §1-3): which drafted tokens the target keeps, and the
one token it adds after them, so that every emitted token follows the target's own
distribution (token for token at temperature 0).

`exact_verifier` is what a round calls with any proposal. It dispatches by what it is given:
greedy agreement at temperature 0; for a sampled chain, block verification or token-level
speculative sampling against the distributions the chain was drawn from; for a sampled tree,
one target sample per visited node. The rules below are pure functions over distributions.

Chain shapes: K draft tokens; `draft_probs` (K, V) holds the distribution each draft token
was sampled from; `target_probs` (K+1, V) holds the target's distribution after the
committed prefix and after each draft token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..sampling import Sampler, best_tokens
from ..tree import TokenTree, TreeVerdict

if TYPE_CHECKING:
    from ..drafters.base import Proposal
    from ..round import Verifier


def exact_verifier(rule: str = "block") -> Verifier:
    """The exact verifier; `rule` is how a sampled chain is checked: "block" (Sun et al.;
    never accepts fewer tokens than "token") or "token" (speculative sampling)."""
    chain_rule = {"block": verify_block, "token": verify_token_level}.get(rule)
    if chain_rule is None:  # the settings name these rules too (config.VERIFIERS); a test keeps them in step
        raise ValueError(f"unknown chain rule {rule!r}")

    def verify(proposal: Proposal, target_logits: torch.Tensor, sampler: Sampler) -> TreeVerdict:
        tree = proposal.tree
        if sampler.greedy:
            return verify_tree_greedy(tree, target_logits)
        if not tree.is_chain:
            return verify_tree_sampled(tree, target_logits, sampler)
        target_probs = sampler.probabilities(target_logits)
        verdict = chain_rule(proposal.tokens, proposal.distributions(target_probs.shape[-1]), target_probs, sampler)
        return TreeVerdict(list(range(1, verdict.accepted + 1)), verdict.next_token)

    return verify


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens, from the start, the target keeps
    next_token: int  # the target's own token after them (correction or bonus)


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> Verdict:
    """Keep draft tokens while they equal the target's argmax; then add the target's argmax."""
    target_best = best_tokens(target_logits)  # (K+1,)
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


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """From the root, follow the child whose token is the target's argmax; when no child
    matches, that argmax is the next token. The output is the target's own greedy output."""
    best = best_tokens(target_logits)
    return _walk(tree, lambda node: best[node])


def verify_tree_sampled(tree: TokenTree, target_logits: torch.Tensor, sampler: Sampler) -> TreeVerdict:
    """Exact at any temperature, top-k and top-p: draw one token from the target's
    distribution at each visited node; follow the child holding it, or emit it and stop.
    Every emitted token is a plain target sample, so the output is distributed as the
    target's; the tree only decides how many of them one forward yields. (With distinct
    deterministic children this accepts exactly as often as recursive rejection would.)"""
    return _walk(tree, lambda node: sampler.draw(sampler.probabilities(target_logits[node][None])[0]))


def _walk(tree: TokenTree, next_token_at) -> TreeVerdict:
    node, path = 0, []
    while True:
        token = next_token_at(node)
        child = tree.child_with_token(node, token)
        if child is None:
            return TreeVerdict(path, token)
        path.append(child)
        node = child
