"""The interface every drafter implements, so a round never asks which one it has.

A drafter proposes a token tree after the context (a chain is a one-branch tree), and after
the target has verified it, observes the outcome: a tree drafter keeps its accepted path's
cache entries and learns its shape from it; a chain drafter ignores it. The outcome is
defined here, beside the proposal it answers, so that drafters and the round (which
imports them) read it from one place below both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
import torch

from ..events import Provenance
from ..runtime import ModelRuntime
from ..sampling import Sampler, one_hot_rows
from ..tree import TokenTree


@dataclass
class Proposal:
    """What a drafter proposes after `context`, whose last token is the tree's root.

    `draft_probs` (K, V), for a chain drafted by sampling, holds the distribution each token
    was drawn from; None means point masses (a deterministic or greedy drafter), which
    speculative sampling verifies exactly too. `unchecked` leading tokens of a chain go out
    without the target checking them (SPRINTER); when all of them do, the round makes no
    target call (`needs_target` False).
    """

    tree: TokenTree
    draft_probs: torch.Tensor | None = None
    draft_calls: int = 0
    unchecked: int = 0
    scores: list[float] = field(default_factory=list)  # trees: each node's cumulative draft log-prob
    stage_proposed: int = 0  # second stage: n-gram tokens the draft scored
    stage_accepted: int = 0  # ... and kept as its own choice
    drafted_by: str | None = None  # the method `auto` chose for this round

    @classmethod
    def chain(cls, context: list[int], tokens: list[int], draft_probs: torch.Tensor | None = None, **details) -> Proposal:
        return cls(TokenTree.chain(context[-1], tokens), draft_probs, **details)

    @property
    def needs_target(self) -> bool:
        return self.unchecked < self.tree.drafted or not self.tree.drafted

    @property
    def tokens(self) -> list[int]:
        """The drafted tokens of a chain, in order."""
        return self.tree.tokens[1:]

    def distributions(self, vocab_size: int) -> torch.Tensor:
        """(K, V): the distribution each chain token was drawn from."""
        return self.draft_probs if self.draft_probs is not None else one_hot_rows(self.tokens, vocab_size)


@dataclass(frozen=True)
class RoundOutcome:
    context_length: int  # the committed tokens the round started from
    proposal: Proposal
    path: list[int]  # accepted tree nodes, from depth 1 down
    tokens: list[int]  # the accepted draft tokens, then the target's own token (if it ran)
    provenance: list[Provenance]
    draft_s: float
    target_s: float
    target_tokens: int  # tokens the target's forward ran: what its cache lacked, then the tree

    @property
    def target_called(self) -> bool:
        return self.target_tokens > 0

    @property
    def unchecked(self) -> int:
        """Tokens that went out without the target checking them (SPRINTER)."""
        return min(self.proposal.unchecked, len(self.path))

    @property
    def proposed(self) -> int:
        """Draft tokens the target could have accepted: the tree's depth past the unchecked ones."""
        return self.proposal.tree.depth - self.proposal.unchecked if self.target_called else 0

    @property
    def accepted(self) -> int:
        return len(self.path) - self.unchecked if self.target_called else 0

    @property
    def draft_calls(self) -> int:
        return self.proposal.draft_calls

    @property
    def tree_nodes(self) -> int:
        """Drafted nodes the target verified (unchecked ones it never saw are not counted)."""
        return self.proposal.tree.drafted - self.proposal.unchecked if self.target_called else 0


class Drafter(ABC):
    name: str = "drafter"
    #: the most tokens one round drafts (the room a prompt must leave past itself)
    lookahead: int = 0

    @abstractmethod
    def propose(self, context: list[int], room: int, sampler: Sampler) -> Proposal:
        """Propose at most `room` tokens deep to follow `context` (the committed tokens)."""

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from a verified round (keep cache entries, adapt the shape)."""

    @property
    def runtimes(self) -> tuple[ModelRuntime, ...]:
        """The models whose caches this drafter keeps in step with the context."""
        return ()

    @property
    def prompt_runtimes(self) -> tuple[ModelRuntime, ...]:
        """The models worth reading a long prompt into before the first round: the ones its
        next rounds will draft with. A model left out catches up when it is next used."""
        return self.runtimes

    def reset(self) -> None:
        """Forget per-conversation state (caches, tables)."""

    def explain(self) -> str:
        """What this drafter chose and why, in plain words, for a reply's figures ("" when
        there is nothing to say)."""
        return ""


class NoDrafter(Drafter):
    """Proposes nothing: every round is one plain target step. This is `ar`, run through
    exactly the same cache and verification machinery as speculative decoding."""

    name = "none"

    def propose(self, context: list[int], room: int, sampler: Sampler) -> Proposal:
        return Proposal.chain(context, [])


class ChainDrafter(Drafter):
    """A drafter of chains of at most `draft_tokens` tokens, from `next_tokens`."""

    def __init__(self, draft_tokens: int):
        self.draft_tokens = draft_tokens
        self.lookahead = draft_tokens

    def propose(self, context: list[int], room: int, sampler: Sampler) -> Proposal:
        return self.propose_chain(context, max(min(self.draft_tokens, room), 0), sampler)

    @abstractmethod
    def propose_chain(self, context: list[int], max_tokens: int, sampler: Sampler) -> Proposal:
        """Up to `max_tokens` tokens after `context`."""
