"""Are one method's replies worse than plain decoding's? The soak's garbage tests (app/soak_scoring.py).

Plain decoding's replies (`ar`) and another method's are two samples of a score: the target's
NLL per token, or the longest loop. A sound engine draws both from one distribution (every
exact method samples the target's own), so which method wrote a reply is, to the score, a
label drawn at random. But only within a prompt: the soak hands each method its own share of
the prompts (with `auto_every` 2, `auto` answers the even ones), and prompts differ by more
than any bug we look for (the demo target's median NLL per token ranges from 0.3 to 2.0
across the 24 chat prompts). So both tests compare replies to the same prompt (the stratum)
and add up over prompts; a prompt only one side answered tells nothing and is left out.

The tail test (`compare_tails`), for some replies gone wrong:

1. each reply's score less the median of its prompt's replies, both sides pooled;
2. the 80th percentile of those over all prompts, and each side's replies at or above it;
3. the p-value: the chance that a random labelling within each prompt gives the method at
   least as many. Given each prompt's pooled scores, which replies are at or above is fixed,
   and under a sound engine which of them are the method's is a draw without replacement: a
   hypergeometric per prompt, their sum by convolution (a stratified one-sided Fisher exact
   test). Exact whatever the scores' distribution, ties included (loop lengths are whole
   numbers; at temperature 0 every reply scores the same), and it counts `ar`'s own sample
   as the sample it is.

Loops have a tail fixed beforehand instead (`compare_above`, the soak's LONG_LOOP): the
loop lengths of a sound reply are a few tokens, and a quantile of them lands in their ties.
A threshold chosen without looking at the replies keeps the test exact as well.

Why the 80th percentile and not the 95th: the threshold comes from the pool, so where a
method's bad replies are more than the tail's share of the pool they fill it and push the
threshold into themselves; and a tail of K replies cannot give a p-value under
(the method's share of the pool)^K. With 250 `auto` replies against the 75 `ar` ones to the
same prompts, a 95th-percentile tail holds 16 and cannot go under 0.77^16 = 0.015; an 80th
holds 65, and a fifth of `auto`'s replies gone wrong then sits above it.

The shift test (`compare_shift`), for every reply a little worse: van Elteren's stratified
rank-sum test, one-sided, from its normal approximation (ties corrected). A tail test needs a
large shift to move a tail; a rank test sees every reply's.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Hashable
from dataclasses import dataclass

TAIL_QUANTILE = 0.8
Scores = list[tuple[Hashable, float]]  # (prompt, score) per reply


@dataclass(frozen=True)
class TailComparison:
    threshold: float  # a reply at or above it is in the tail (NLL: above its prompt's median)
    reference_above: int
    reference_count: int
    method_above: int
    method_count: int
    p_value: float  # the chance of the method holding `method_above` or more of the tail by luck

    def to_dict(self) -> dict:
        return {
            "threshold": self.threshold, "reference_above": self.reference_above,
            "reference_count": self.reference_count, "method_above": self.method_above, "method_count": self.method_count,
            "p_value": self.p_value,
        }


@dataclass(frozen=True)
class ShiftComparison:
    z: float  # how many standard deviations the method's ranks sit above a random labelling's
    p_value: float

    def to_dict(self) -> dict:
        return {"z": self.z, "p_value": self.p_value}


def by_prompt(reference: Scores, method: Scores) -> list[tuple[list[float], list[float]]]:
    """(reference's scores, method's scores) for each prompt both sides answered."""
    strata: dict[Hashable, tuple[list[float], list[float]]] = {}
    for side, scores in enumerate((reference, method)):
        for prompt, score in scores:
            strata.setdefault(prompt, ([], []))[side].append(score)
    return [(ours, theirs) for ours, theirs in strata.values() if ours and theirs]


def compare_tails(reference: Scores, method: Scores, quantile: float = TAIL_QUANTILE) -> TailComparison:
    """How many of `method`'s replies lie in the pooled upper tail, prompt by prompt, against
    `reference`'s, and the one-sided p-value of that many or more if the two were one sample.
    The tail: at or above the pool's `quantile` of each score less its prompt's median."""
    strata = []
    for ours, theirs in by_prompt(reference, method):
        median = statistics.median(ours + theirs)
        strata.append(([score - median for score in ours], [score - median for score in theirs]))
    pooled = sorted(score for ours, theirs in strata for score in ours + theirs)
    if not pooled:
        return TailComparison(math.nan, 0, 0, 0, 0, 1.0)
    return _tail_test(strata, pooled[min(len(pooled) - 1, int(quantile * len(pooled)))])


def compare_above(reference: Scores, method: Scores, threshold: float) -> TailComparison:
    """The same test for a tail fixed beforehand: the scores at or above `threshold`."""
    return _tail_test(by_prompt(reference, method), threshold)


def _tail_test(strata: list[tuple[list[float], list[float]]], threshold: float) -> TailComparison:
    chances = [1.0]  # chances[k]: the method holding k of the tail, over the prompts so far
    reference_above = method_above = 0
    for ours, theirs in strata:
        ours_above, theirs_above = sum(score >= threshold for score in ours), sum(score >= threshold for score in theirs)
        reference_above, method_above = reference_above + ours_above, method_above + theirs_above
        chances = convolved(chances, hypergeometric(len(ours) + len(theirs), ours_above + theirs_above, len(theirs)))
    p_value = min(1.0, sum(chances[method_above:]))
    return TailComparison(threshold, reference_above, sum(len(ours) for ours, _ in strata), method_above,
                          sum(len(theirs) for _, theirs in strata), p_value)


def compare_shift(reference: Scores, method: Scores) -> ShiftComparison:
    """Van Elteren's test: the method's rank sum within each prompt, weighted by 1/(replies + 1),
    against a random labelling's; one-sided (higher is worse)."""
    statistic = expected = variance = 0.0
    for ours, theirs in by_prompt(reference, method):
        pool = len(ours) + len(theirs)
        ranks = midranks(ours + theirs)
        ties = sum(count**3 - count for count in _tie_counts(ours + theirs))
        weight = 1.0 / (pool + 1)
        statistic += weight * sum(ranks[len(ours):])
        expected += weight * len(theirs) * (pool + 1) / 2
        variance += weight**2 * len(ours) * len(theirs) / 12 * ((pool + 1) - ties / (pool * (pool - 1)))
    if variance <= 0:
        return ShiftComparison(0.0, 1.0)
    z = (statistic - expected) / math.sqrt(variance)
    return ShiftComparison(z, 0.5 * math.erfc(z / math.sqrt(2)))


def hypergeometric(population: int, marked: int, drawn: int) -> list[float]:
    """P(X = k) for k = 0 … min(marked, drawn), X the marked items among `drawn` taken without replacement
    from `population` items of which `marked` are marked. In logarithms (lgamma), so large pools
    neither overflow nor need big-integer binomials."""
    all_draws = _log_comb(population, drawn)
    return [
        math.exp(_log_comb(marked, k) + _log_comb(population - marked, drawn - k) - all_draws)
        if k <= marked and drawn - k <= population - marked else 0.0
        for k in range(min(marked, drawn) + 1)
    ]


def convolved(first: list[float], second: list[float]) -> list[float]:
    """The distribution of the sum of two independent counts, from theirs."""
    total = [0.0] * (len(first) + len(second) - 1)
    for i, p in enumerate(first):
        if p:
            for j, q in enumerate(second):
                total[i + j] += p * q
    return total


def midranks(values: list[float]) -> list[float]:
    """Each value's rank, 1 for the smallest, tied values sharing their ranks' mean."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _tie_counts(values: list[float]) -> list[int]:
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return list(counts.values())


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
