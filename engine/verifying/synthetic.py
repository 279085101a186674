"""Synthetic acceptance, for benchmarks only: draft tokens are kept at random with given
per-depth probabilities instead of by agreement with the target (llama.cpp's
`--spec-synth-rates`, which this follows).

Why: speculation's speed on a model depends on two things, what the machinery costs (the
drafter's calls, the verify forward, the bookkeeping) and how often the target keeps what
was drafted. Weight-random models of real shapes have the first and not the second. With
the acceptance drawn from rates that real pairs measure, the drafters still run and pay
their real cost and the target still verifies every tree, so the measured speed is what
that machinery would give a real pair that accepts at those rates. The text is not valid:
kept tokens are whatever was drafted.

`rates[d]` is the unconditional probability that the drafted token at depth d + 1 is kept,
non-increasing as llama.cpp requires; a round keeps depth d + 1, given it kept depth d, with
probability rates[d] / rates[d - 1]. In a tree a round follows the child with the deepest
branch below it (the first drafted among equals), so a tree drafted d deep can keep d tokens
at the rate a chain of d would; it never keeps a drafted stop token, which would end the reply
early (as llama.cpp). After the kept tokens the target adds its own token, as in any round.
"""
from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import torch

from ..sampling import Sampler, best_tokens
from ..tree import TreeVerdict

if TYPE_CHECKING:
    from ..drafters.base import Proposal
    from ..round import Verifier


def checked_rates(rates: tuple[float, ...]) -> tuple[float, ...]:
    """`rates` as given, or ValueError saying what is wrong with them."""
    if not rates:
        raise ValueError("synthetic acceptance needs at least one rate")
    if any(not math.isfinite(rate) or not 0.0 <= rate <= 1.0 for rate in rates):
        raise ValueError("synthetic acceptance rates must be numbers within [0, 1]")
    if any(later > earlier for earlier, later in zip(rates, rates[1:])):
        raise ValueError("synthetic acceptance rates must not increase with depth (each is the chance to reach that depth)")
    return tuple(rates)


def conditional_rates(rates: tuple[float, ...]) -> list[float]:
    """The chance to keep depth d + 1 once depth d is kept."""
    previous = [1.0, *rates[:-1]]
    return [rate / before if before > 0 else 0.0 for rate, before in zip(rates, previous)]


def synthetic_verifier(rates: tuple[float, ...], stop_ids: frozenset[int], seed: int | None = None) -> Verifier:
    keep_chances = conditional_rates(checked_rates(rates))
    draws = random.Random(seed)

    def verify(proposal: Proposal, target_logits: torch.Tensor | None, sampler: Sampler) -> TreeVerdict:
        if target_logits is None or proposal.unchecked:
            raise ValueError("synthetic acceptance needs a target call over the whole tree")
        tree = proposal.tree
        deepest = _deepest_below(tree.parents, tree.depths)
        node, path = 0, []
        while len(path) < len(keep_chances):
            children = tree.children(node)
            if not children or draws.random() >= keep_chances[len(path)]:
                break
            child = max(children, key=lambda candidate: deepest[candidate])  # max keeps the first of equals
            if tree.tokens[child] in stop_ids:
                break
            node = child
            path.append(node)
        return TreeVerdict(path, _targets_token(target_logits[node], sampler))

    return verify


def _deepest_below(parents: list[int], depths: list[int]) -> list[int]:
    """Each node's deepest descendant's depth (its own where it has none)."""
    deepest = list(depths)
    for node in range(len(parents) - 1, 0, -1):  # a parent always comes before its children
        deepest[parents[node]] = max(deepest[parents[node]], deepest[node])
    return deepest


def _targets_token(logits: torch.Tensor, sampler: Sampler) -> int:
    if sampler.greedy:
        return best_tokens(logits[None])[0]
    return sampler.draw(sampler.probabilities(logits[None])[0])
