"""One speculative decoding round: draft, verify in one target forward, accept.

`ar` is the same round with a drafter that proposes nothing, so the reference speed and the
speculative methods share one cache and one code path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .drafters.base import Drafter
from .events import Provenance
from .kv import CachedModel
from .sampling import Sampler
from .verify import verify_block, verify_greedy, verify_token_level


@dataclass(frozen=True)
class RoundOutcome:
    tokens: list[int]  # the accepted draft tokens, then the target's own token
    provenance: list[Provenance]
    proposed: int
    accepted: int
    draft_calls: int
    draft_s: float
    target_s: float


def speculative_round(
    target: CachedModel,
    drafter: Drafter,
    context: list[int],
    draft_tokens: int,
    sampler: Sampler,
    verifier: str = "block",
) -> RoundOutcome:
    # 1. draft
    started = time.perf_counter()
    proposal = drafter.propose(context, draft_tokens, sampler)
    drafted = time.perf_counter()

    # 2. verify: one target forward over what its cache lacks plus the whole draft
    logits = target.logits_for(context, proposal.tokens)  # (K+1, V)
    if sampler.greedy:
        verdict = verify_greedy(proposal.tokens, logits)
    else:
        target_probs = sampler.probabilities(logits)
        draft_probs = proposal.distributions(target_probs.shape[-1])
        verify = verify_block if verifier == "block" else verify_token_level
        verdict = verify(proposal.tokens, draft_probs, target_probs, sampler)

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
