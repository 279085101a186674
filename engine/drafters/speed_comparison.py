"""How many times plain decoding's speed a method runs here, claimed only where the rounds
measured can carry the claim.

`auto`'s running averages choose a method; they cannot carry a figure. On a busy 2-core host a
reply of 2.7 tok/s said "tree, 102.33× plain decoding's speed": plain decoding's average rested
on its few trial rounds, one of them stalled for seconds by another process, and the method's
on rounds taken minutes later (issue 45). So the figure comes from this process's own recent
rounds only, and only when

1. both sides have at least COMPARED_ROUNDS rounds taken within COMPARABLE_S of each other
   (the same machine load, as far as a desktop's load holds still), the same number of each;
2. each side's time is its median round's, so a stall in a few rounds moves nothing;
3. the result is no more than the method's tokens per round allow: every round of an exact
   method calls the target once on at least one token, which costs no less than a round of
   plain decoding, so it can at most be as many times faster as it keeps tokens per round.
   A figure above that says the two sides were not measured alike; it is withheld.
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

COMPARED_ROUNDS = 8  # the fewest rounds of each side a figure rests on
MOST_COMPARED_ROUNDS = 32  # rounds kept per candidate: the newest, so the figure follows the load
COMPARABLE_S = 300.0  # rounds further apart than this (wall clock) were taken under another load
# Medians of 8-32 noisy rounds each: a true figure near the bound may measure a little above it.
BOUND_SLACK = 1.2


@dataclass(frozen=True)
class TimedRound:
    ended_at: float  # time.monotonic() when the round ended
    seconds: float
    tokens: int


def recent_rounds() -> deque[TimedRound]:
    return deque(maxlen=MOST_COMPARED_ROUNDS)


@dataclass(frozen=True)
class SpeedComparison:
    factor: float  # the method's tokens per second over plain decoding's
    rounds: int  # rounds of each side it rests on

    def describe(self, method: str) -> str:
        return (f"{method}, {self.factor:.2f}× plain decoding's speed on this machine "
                f"(median of {self.rounds} recent rounds of each)")


def compare(method: Sequence[TimedRound], plain: Sequence[TimedRound]) -> SpeedComparison | None:
    """`method` against `plain` decoding from their rounds, oldest first; None where those
    rounds cannot carry a figure (the module's note)."""
    if not method or not plain:
        return None
    newest = max(method[-1].ended_at, plain[-1].ended_at)
    method_rounds = [one for one in method if one.ended_at >= newest - COMPARABLE_S]
    plain_rounds = [one for one in plain if one.ended_at >= newest - COMPARABLE_S]
    count = min(len(method_rounds), len(plain_rounds))
    if count < COMPARED_ROUNDS:
        return None
    method_rounds, plain_rounds = method_rounds[-count:], plain_rounds[-count:]
    # A round's time hardly depends on how many of its tokens were kept (the target checks the
    # whole draft either way), so a side's seconds per token is its median round over its mean
    # tokens per round.
    method_tokens = statistics.fmean(one.tokens for one in method_rounds)
    plain_tokens = statistics.fmean(one.tokens for one in plain_rounds)  # 1 each
    method_per_token = statistics.median(one.seconds for one in method_rounds) / method_tokens
    plain_per_token = statistics.median(one.seconds for one in plain_rounds) / plain_tokens
    if method_per_token <= 0 or plain_per_token <= 0:
        return None
    factor = plain_per_token / method_per_token
    if factor > method_tokens / plain_tokens * BOUND_SLACK:
        return None
    return SpeedComparison(factor, count)
