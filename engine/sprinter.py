"""One SPRINTER round (ALGORITHMS.md §4, seed 000): approximate verification.

The draft writes token by token and a learned verifier scores each token from the draft's
hidden state. Tokens it passes go out without the target ever seeing them; the first token
it flags makes the target run once over everything it has not cached yet, and only that
token is checked, by the same exact verifier chains use. The unflagged tokens are the
approximation: each is the draft's token where the target would have rejected it with
probability η, the verifier's false-positive rate, so the output drifts from the target's
distribution by η·d_TV(p, q) per unchecked token. Replies mark those tokens UNCHECKED.
"""
from __future__ import annotations

import time

import torch

from .decoding import RoundOutcome
from .drafters.model_drafter import draft_distribution, fit_vocab
from .events import Provenance
from .heads.features import head_features
from .heads.store import DraftHeads, mode_for
from .runtime import ModelRuntime
from .sampling import Sampler
from .verify import ChainVerifier


def sprinter_round(
    target: ModelRuntime,
    draft: ModelRuntime,
    heads: DraftHeads,
    context: list[int],
    max_unchecked: int,
    sampler: Sampler,
    verify: ChainVerifier,
) -> RoundOutcome:
    mode = mode_for(sampler.greedy)
    started = time.perf_counter()
    calls_before = draft.forward_calls
    logits = fit_vocab(draft.logits_for(context)[-1], target.vocab_size)
    unchecked: list[int] = []
    flagged: tuple[int, torch.Tensor] | None = None  # (token, the distribution it was drawn from)
    while True:
        probs = draft_distribution(logits, sampler)
        token = int(torch.argmax(logits)) if sampler.greedy else sampler.draw(probs)
        features = head_features(draft.last_hidden_states()[-1:], probs[None], torch.tensor([token]))[0]
        if not heads.passes(mode, features):
            flagged = (token, probs)
            break
        unchecked.append(token)
        if len(unchecked) == max_unchecked:
            break
        logits = fit_vocab(draft.forward([token])[-1], target.vocab_size)
    drafted = time.perf_counter()
    draft_calls = draft.forward_calls - calls_before

    if flagged is None:  # every token passed: this round never calls the target
        return RoundOutcome(
            tokens=unchecked, provenance=[Provenance.UNCHECKED] * len(unchecked), proposed=0, accepted=0,
            draft_calls=draft_calls, draft_s=drafted - started, target_s=0.0, target_called=False, unchecked=len(unchecked),
        )

    # One target forward over what its cache lacks, the unchecked tokens and the flagged one;
    # only the flagged token is verified (with a bonus token when it is accepted).
    token, probs = flagged
    written = context + unchecked
    target_logits = target.logits_for(written, [token])  # (2, V)
    verdict = verify([token], None if sampler.greedy else probs[None], target_logits, sampler)
    target.crop(len(written) + verdict.accepted)
    verified = time.perf_counter()
    checked = [token] if verdict.accepted else []
    return RoundOutcome(
        tokens=unchecked + checked + [verdict.next_token],
        provenance=[Provenance.UNCHECKED] * len(unchecked)
        + [Provenance.DRAFT] * len(checked)
        + [Provenance.BONUS if verdict.accepted else Provenance.TARGET],
        proposed=1,
        accepted=verdict.accepted,
        draft_calls=draft_calls,
        draft_s=drafted - started,
        target_s=verified - drafted,
        unchecked=len(unchecked),
    )
