"""One speculative round, for every method: draft a token tree, verify it in one target
forward, keep the accepted path.

A chain is a one-branch tree, `ar` a tree of the root alone, and SPRINTER a chain whose
leading tokens its verifier passes unchecked (with no target call at all when it passes
every one). So one round serves all of them; methods differ only in their drafter and
their verifier (engine/methods.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .drafters.base import Drafter, Proposal, RoundOutcome
from .events import Provenance
from .runtime import ModelRuntime
from .sampling import Sampler
from .tree import TokenTree, TreeVerdict, forward_tree, keep_path

# (proposal, the target's logits at nodes proposal.unchecked.. or None without a target
# call, sampler) -> the accepted path and the target's own next token (None without a call)
Verifier = Callable[[Proposal, "torch.Tensor | None", Sampler], TreeVerdict]


def play_round(
    target: ModelRuntime, drafter: Drafter, verify: Verifier, context: list[int], room: int, sampler: Sampler
) -> RoundOutcome:
    """Draft at most `room` tokens deep after `context`, verify, keep the accepted path."""
    try:
        return _play(target, drafter, verify, context, room, sampler)
    except BaseException:
        # Between drafting and committing, the caches may hold tree branches that are not a
        # causal sequence; after a failure they must not be mistaken for context.
        target.reset()
        drafter.reset()
        raise


def _play(target: ModelRuntime, drafter: Drafter, verify: Verifier, context: list[int], room: int, sampler: Sampler) -> RoundOutcome:
    # 1. draft
    started = time.perf_counter()
    proposal = drafter.propose(context, room, sampler)
    drafted = time.perf_counter()

    # 2. verify: one target forward over what its cache lacks plus the tree (none when every
    # drafted token goes out unchecked)
    tree = proposal.tree
    target_tokens = 0
    logits = None
    if proposal.needs_target:
        target_tokens = len(target.pending(context)) + tree.drafted
        logits = forward_tree(target, context, tree, first_row=proposal.unchecked)  # (N - unchecked, V)
    verdict = verify(proposal, logits, sampler)

    # 3. keep the accepted path in the target's cache; its own token is not cached yet
    if logits is not None:
        keep_path(target, len(context), verdict.path)
    verified = time.perf_counter()

    outcome = RoundOutcome(
        context_length=len(context),
        proposal=proposal,
        path=verdict.path,
        tokens=[tree.tokens[node] for node in verdict.path] + ([verdict.next_token] if verdict.next_token is not None else []),
        provenance=_provenance(tree, verdict, proposal.unchecked),
        draft_s=drafted - started,
        target_s=verified - drafted,
        target_tokens=target_tokens,
    )
    drafter.observe(outcome)
    return outcome


def _provenance(tree: TokenTree, verdict: TreeVerdict, unchecked: int) -> list[Provenance]:
    kinds = [Provenance.UNCHECKED if depth <= unchecked else Provenance.DRAFT for depth in range(1, len(verdict.path) + 1)]
    if verdict.next_token is not None:
        # The target's token after a path that used up its branch is a bonus; after a
        # rejection (or with nothing drafted) it is the target's own correction.
        ended_at_leaf = bool(verdict.path) and not tree.child_count(verdict.path[-1])
        kinds.append(Provenance.BONUS if ended_at_leaf else Provenance.TARGET)
    return kinds


def time_verify(target: ModelRuntime, context: list[int], tokens: int) -> float:
    """Seconds of one target forward over `tokens` new tokens after `context`; the cache is
    left holding the context, as before."""
    filler = TokenTree.chain(context[-1], [context[-1]] * max(tokens - 1, 0))
    target.catch_up(context)  # what the context still lacks is not part of the timing
    started = time.perf_counter()
    logits = forward_tree(target, context, filler)
    float(logits[-1, 0])  # wait for the device: on a GPU the call only queues the work
    seconds = time.perf_counter() - started
    target.crop(len(context) - 1)
    return seconds
