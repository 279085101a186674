"""One speculative decoding round: draft, verify in one target forward, accept.

`ar` is the same round with a drafter that proposes nothing, so the reference speed and the
speculative methods share one cache and one code path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .drafters.base import Drafter
from .drafters.tree_drafter import TreeDrafter
from .events import Provenance
from .runtime import ModelRuntime
from .sampling import Sampler
from .tree import TokenTree, forward_tree, keep_path, verify_tree_greedy, verify_tree_sampled
from .tree_shape import TreePolicy
from .verify import ChainVerifier


@dataclass(frozen=True)
class RoundOutcome:
    tokens: list[int]  # the accepted draft tokens, then the target's own token
    provenance: list[Provenance]
    proposed: int  # draft tokens that could have been accepted: K for a chain, the depth of a tree
    accepted: int
    draft_calls: int
    draft_s: float
    target_s: float
    tree_nodes: int = 0  # drafted nodes verified, for trees
    stage_proposed: int = 0
    stage_accepted: int = 0
    target_called: bool = True  # False for a SPRINTER round whose verifier flagged nothing
    unchecked: int = 0  # SPRINTER: leading tokens that went out without the target checking them


def speculative_round(
    target: ModelRuntime,
    drafter: Drafter,
    context: list[int],
    draft_tokens: int,
    sampler: Sampler,
    verify: ChainVerifier,
) -> RoundOutcome:
    # 1. draft
    started = time.perf_counter()
    proposal = drafter.propose(context, draft_tokens, sampler)
    drafted = time.perf_counter()

    # 2. verify: one target forward over what its cache lacks plus the whole draft
    logits = target.logits_for(context, proposal.tokens)  # (K+1, V)
    verdict = verify(proposal.tokens, proposal.probs, logits, sampler)

    # 3. roll the target back to the accepted prefix; its own token is not cached yet
    target.crop(len(context) + verdict.accepted)
    verified = time.perf_counter()

    kept = proposal.tokens[: verdict.accepted]
    if not proposal.tokens:
        own = Provenance.TARGET
    else:
        own = Provenance.BONUS if verdict.accepted == len(proposal.tokens) else Provenance.TARGET
    return RoundOutcome(
        tokens=kept + [verdict.next_token],
        provenance=[Provenance.DRAFT] * len(kept) + [own],
        proposed=len(proposal.tokens),
        accepted=verdict.accepted,
        draft_calls=proposal.forward_calls,
        draft_s=drafted - started,
        target_s=verified - drafted,
    )


def tree_round(
    target: ModelRuntime, drafter: TreeDrafter, context: list[int], policy: TreePolicy, sampler: Sampler
) -> RoundOutcome:
    """Draft a token tree, verify all of it in one target forward, keep the accepted path."""
    try:
        return _tree_round(target, drafter, context, policy, sampler)
    except BaseException:
        # Between drafting and committing, both caches hold tree branches that are not a
        # causal sequence; after a failure they must not be mistaken for context.
        target.reset()
        drafter.reset()
        raise


def _tree_round(
    target: ModelRuntime, drafter: TreeDrafter, context: list[int], policy: TreePolicy, sampler: Sampler
) -> RoundOutcome:
    if not policy.calibrated:
        policy.calibrate(lambda tokens: time_verify(target, context, tokens))
    # 1. draft, when drafting has been paying on this device; otherwise verify the root alone,
    # a plain target step (the first round of a reply also prefills the new turn)
    prefill = len(target.pending(context)) > 1
    speculate = policy.speculate()
    started = time.perf_counter()
    if speculate:
        # A draft that sat out plain rounds first reads what it missed; the policy learns
        # what a round costs without that.
        drafter.draft.catch_up(context)
    caught_up = time.perf_counter()
    proposal = drafter.propose(context, policy.shape(), policy.choose_budget) if speculate else drafter.root_only(context)
    drafted = time.perf_counter()

    # 2. verify the whole tree in one forward, then keep only the accepted path's entries
    tree = proposal.tree
    verify_tokens = len(target.pending(context)) + tree.drafted
    logits = forward_tree(target, context, tree)  # (N, V)
    if sampler.greedy:
        verdict = verify_tree_greedy(tree, logits)
    else:
        verdict = verify_tree_sampled(tree, logits, sampler)
    keep_path(target, len(context), verdict.path)
    verified = time.perf_counter()
    drafter.commit(len(context), proposal, verdict.path)

    kept = [tree.tokens[node] for node in verdict.path]
    own = Provenance.BONUS if verdict.path and not tree.child_count(verdict.path[-1]) else Provenance.TARGET
    policy.record(
        tree.depths, proposal.scores, len(verdict.path), len(kept) + 1,
        drafted - caught_up, proposal.draft_calls, verify_tokens, verified - drafted, time.perf_counter() - caught_up,
        learn_costs=not prefill,  # a prefill's time says nothing about a round's
    )
    return RoundOutcome(
        tokens=kept + [verdict.next_token],
        provenance=[Provenance.DRAFT] * len(kept) + [own],
        proposed=tree.depth,
        accepted=len(kept),
        draft_calls=proposal.draft_calls,
        draft_s=drafted - started,
        target_s=verified - drafted,
        tree_nodes=tree.drafted,
        stage_proposed=proposal.stage_proposed,
        stage_accepted=proposal.stage_accepted,
    )


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
