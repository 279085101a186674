"""Growing a token tree with the draft model (ALGORITHMS.md §3).

Best-first by the path's cumulative draft log-probability: every expanded node offers its
top-k tokens as children; the best `beam` new nodes of each depth are expanded next, all in
one batched draft forward under a tree mask; at the end the `budget` best nodes overall
(always with their ancestors) form the tree. Leaves cost no draft call.

With a second stage, an n-gram model first proposes a chain; the draft scores it in the
same forward that processes the new context, keeps the prefix that matches its own argmax,
and its logits along that prefix give those nodes' children without further calls.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..runtime import ModelRuntime
from ..sampling import Sampler
from ..tree import TokenTree
from .backoff_ngram import BackoffNgram
from .base import Drafter, Proposal, RoundOutcome
from .model_drafter import fit_vocab

BudgetRule = Callable[[list[tuple[int, float]]], int]


@dataclass(frozen=True)
class TreeShape:
    budget: int = 16  # drafted nodes verified per target call
    depth: int = 4  # longest path
    branching: int = 3  # children offered by each expanded node
    beam: int = 3  # nodes expanded per depth

    def __post_init__(self) -> None:
        if self.budget < 1 or self.depth < 1 or self.branching < 1 or self.beam < 1:
            raise ValueError("tree budget, depth, branching and beam must be at least 1")


@dataclass(frozen=True)
class TreeRound:
    """What one verified tree round teaches its shape policy."""

    depths: list[int]  # each node's depth (the root's is 0)
    scores: list[float]  # each node's cumulative draft log-probability
    accepted_depth: int
    tokens: int  # tokens the round wrote
    draft_seconds: float  # growing the tree, not catching up on the context
    draft_calls: int
    verify_tokens: int  # tokens the target's forward ran
    verify_seconds: float
    round_seconds: float
    learn_costs: bool = True  # False when the timings include a prefill


class TreePolicy(Protocol):
    """What the tree drafter asks of its shape policy, fixed or automatic (engine/tree_shape.py)."""

    @property
    def calibrated(self) -> bool: ...

    def calibrate(self, measure: Callable[[int], float]) -> None: ...

    def speculate(self) -> bool: ...

    def shape(self) -> TreeShape: ...

    def choose_budget(self, candidates: list[tuple[int, float]]) -> int: ...

    def record(self, observed: TreeRound) -> None: ...


@dataclass
class _Node:
    token: int
    parent: int
    depth: int
    score: float


class TreeDrafter(Drafter):
    """Draft model trees shaped by a policy (fixed, or chosen each round from measurements);
    when the policy says drafting does not pay, a round is a plain target step."""

    def __init__(self, draft: ModelRuntime, target_vocab_size: int, policy: TreePolicy, second_stage: BackoffNgram | None = None):
        self.draft = draft
        self.vocab_size = target_vocab_size
        self.policy = policy
        self.second_stage = second_stage
        self.lookahead = policy.shape().depth
        self._slots: dict[int, int] = {}  # last proposal's tree node -> draft cache slot
        self._timing = (0.0, 0)  # last proposal's drafting seconds (after catching up), draft calls

    @property
    def name(self) -> str:
        return "draft model tree" + (" + n-gram stage" if self.second_stage else "")

    @property
    def runtimes(self) -> tuple[ModelRuntime, ...]:
        return (self.draft,)

    def propose(self, context: list[int], room: int, sampler: Sampler) -> Proposal:
        shape = self.policy.shape()
        # Near the end of the context a tree may not fit; an EAGLE-3 head cannot draft before
        # the target has read the prompt.
        if shape.depth >= room or not self.draft.ready_for(context) or not self.policy.speculate():
            self._slots, self._timing = {}, (0.0, 0)
            return Proposal(TokenTree([context[-1]], [-1]), scores=[0.0])
        # A draft that sat out plain rounds first reads what it missed; the policy learns
        # what a round costs without that.
        self.draft.catch_up(context)
        started = time.perf_counter()
        proposal = self.grow(context, shape, self.policy.choose_budget)
        self._timing = (time.perf_counter() - started, proposal.draft_calls)
        return proposal

    def observe(self, outcome: RoundOutcome) -> None:
        """Keep the draft's cache entries of the accepted path, and teach the policy."""
        self._commit(outcome.context_length, outcome.path)
        tree = outcome.proposal.tree
        draft_seconds, draft_calls = self._timing
        self.policy.record(TreeRound(
            depths=tree.depths, scores=outcome.proposal.scores, accepted_depth=len(outcome.path),
            tokens=len(outcome.tokens), draft_seconds=draft_seconds, draft_calls=draft_calls,
            verify_tokens=outcome.target_tokens, verify_seconds=outcome.target_s,
            round_seconds=draft_seconds + outcome.target_s,
            learn_costs=outcome.target_tokens == len(tree),  # a prefill's time says nothing about a round's
        ))
        self.lookahead = self.policy.shape().depth

    def grow(self, context: list[int], shape: TreeShape, budget_rule: BudgetRule | None = None) -> Proposal:
        """Grow a tree after `context`. `budget_rule`, given the candidate nodes best first as
        (depth, score) pairs, may choose fewer nodes than `shape.budget`."""
        calls_before = self.draft.forward_calls
        root_slot = len(context) - 1
        chain = self.second_stage.propose(context, shape.depth - 1) if self.second_stage else []
        logits = self._scores(self.draft.logits_for(context, chain))  # (1 + len(chain), V)
        children = _top_children(logits, shape.branching)  # per row: (tokens, log-probs), best first
        # The draft keeps the n-gram chain while it agrees with the draft's own first choice.
        kept = 0
        while kept < len(chain) and children[kept][0][0] == chain[kept]:
            kept += 1
        self.draft.crop(len(context) + kept)

        nodes = [_Node(context[-1], -1, 0, 0.0)]
        slots = {0: root_slot}
        children_of: dict[int, tuple[list[int], list[float]]] = {0: children[0]}
        spine = [0]
        for step, token in enumerate(chain[:kept], start=1):
            nodes.append(_Node(token, spine[-1], step, nodes[spine[-1]].score + children[step - 1][1][0]))
            spine.append(len(nodes) - 1)
            slots[spine[-1]] = len(context) - 1 + step
            children_of[spine[-1]] = children[step]

        frontier = [0]
        for depth in range(shape.depth):
            unexpanded = [node for node in frontier if node not in children_of]
            if unexpanded:
                self._expand(context, nodes, slots, unexpanded, children_of, shape.branching)
            new_nodes = []
            for parent in frontier:
                for token, logprob in zip(*children_of[parent]):
                    existing = next((n for n in spine if nodes[n].parent == parent and nodes[n].token == token), None)
                    if existing is not None:
                        new_nodes.append(existing)
                        continue
                    nodes.append(_Node(token, parent, depth + 1, nodes[parent].score + logprob))
                    new_nodes.append(len(nodes) - 1)
            if depth + 1 < len(spine):
                frontier = [spine[depth + 1]]  # the second stage already ran this node
            else:
                frontier = heapq.nlargest(shape.beam, new_nodes, key=lambda n: nodes[n].score)
        ranked = _ranked_candidates(nodes)[: shape.budget]
        budget = budget_rule([(nodes[n].depth, nodes[n].score) for n in ranked]) if budget_rule else len(ranked)
        tree, scores, self._slots = _subtree(nodes, slots, ranked[:budget])
        return Proposal(
            tree, draft_calls=self.draft.forward_calls - calls_before, scores=scores,
            stage_proposed=len(chain), stage_accepted=kept,
        )

    def _expand(
        self,
        context: list[int],
        nodes: list[_Node],
        slots: dict[int, int],
        batch: list[int],
        children_of: dict[int, tuple[list[int], list[float]]],
        branching: int,
    ) -> None:
        """One draft forward over `batch` (nodes of one depth whose ancestors the draft has
        run), each seeing the context, its ancestors and itself."""
        past = len(self.draft)
        parents = [slots[nodes[node].parent] for node in batch]
        logits = self._scores(self.draft.forward_tree([nodes[n].token for n in batch], parents, len(batch)))
        for row, (node, offered) in enumerate(zip(batch, _top_children(logits, branching))):
            slots[node] = past + row
            children_of[node] = offered

    def _commit(self, context_length: int, path: list[int]) -> None:
        """Keep the draft's cache entries of the accepted path; drop every other branch."""
        kept = []
        for node in path:
            if node not in self._slots:
                break
            kept.append(self._slots[node])
        self.draft.keep_slots(context_length, kept)

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities over the target's vocabulary."""
        return torch.log_softmax(fit_vocab(logits, self.vocab_size), dim=-1)

    def reset(self) -> None:
        self.draft.reset()
        if self.second_stage:
            self.second_stage.reset()


def _top_children(logprobs: torch.Tensor, branching: int) -> list[tuple[list[int], list[float]]]:
    """For each row of (N, V) log-probs, its `branching` best tokens and their log-probs,
    in one top-k and one transfer to the host."""
    best = torch.topk(logprobs, branching, dim=-1)
    return list(zip(best.indices.tolist(), best.values.tolist()))


def _ranked_candidates(nodes: list[_Node]) -> list[int]:
    """Drafted nodes best first by score, each after its parent (a child's score never
    beats its parent's, but ties happen)."""
    order = sorted(range(1, len(nodes)), key=lambda n: (-nodes[n].score, nodes[n].depth))
    placed, ranked = {0}, []
    while order:
        rest = []
        for node in order:
            if nodes[node].parent in placed:
                placed.add(node)
                ranked.append(node)
            else:
                rest.append(node)
        order = rest
    return ranked


def _subtree(nodes: list[_Node], slots: dict[int, int], chosen: list[int]) -> tuple[TokenTree, list[float], dict[int, int]]:
    """The tree of the root and `chosen` (closed under ancestry), renumbered so that parents
    come first, with the draft cache slots of the nodes the draft has run."""
    ranked = sorted([0, *chosen], key=lambda n: (nodes[n].depth, n))
    index = {old: new for new, old in enumerate(ranked)}
    tree = TokenTree(
        [nodes[n].token for n in ranked],
        [-1] + [index[nodes[n].parent] for n in ranked[1:]],
        [nodes[n].depth for n in ranked],
    )
    kept_slots = {index[n]: slot for n, slot in slots.items() if n in index}
    return tree, [nodes[n].score for n in ranked], kept_slots
