"""How many tokens a chain drafts each round, at most K, chosen from what its rounds have cost
and kept on this machine (`chain`, `eagle` and `auto`'s chains alike).

Why: on the 2-core CPU the demo pair's EAGLE-3 head kept its first token 55% of the time and
its second 27%; a call of the head cost ~1 ms against a ~6.5 ms step, and a verify of k + 1
tokens a little more than a step. Its chains of 1 and 2 tokens ran 1.12× and 1.14× plain
decoding, where chains of 4 ran 1.02× (docs/BENCHMARKS.md). On a GPU, where a verify of many
tokens costs what one does, longer chains pay. So the length is measured, not fixed: the
length k of the next chain maximises expected tokens per second,
(1 + reach(1) + ... + reach(k)) / (k × draft call + verify(k + 1)), where reach(d) is the
chance that a chain keeps its d-th token, from the kept share at each depth. Every
EXPLORE_EVERY rounds one chain is a token longer (or shorter) than the choice, so the costs and
acceptance beside it stay measured and a conversation that drafts better is noticed.
Verification is untouched: the length only decides how many tokens the target checks.

A pair keeps one per drafter across replies (session.py), and its verify costs start from the
curve the pair measured at load for its tree shapes (`seed`): with nothing measured, a chain
drafted K tokens and priced every other length like K + 1, so it stayed at K for its first
reply. On a weight-random Llama-3.1-8B shape at 4 bits on 2 cores a verify of 2 tokens cost
what a step did (~0.12 s) and one of 5 ~1.8 steps: at acceptance rates (0.6, 0.36, 0.22,
0.13) chains of 4 wrote 1.15x plain decoding, chains of measured length (1.3-1.8 tokens on
average) 1.13x and 1.38x in two runs (docs/BENCHMARKS.md). Since the int4 product fetches its
weights ahead, a verify of 8 tokens there costs 1.3-2x a step, and the measured length is ~3.
"""
from __future__ import annotations

from .verify_curve import cost_at

SMOOTHING = 0.2  # weight of the newest round in the running averages of costs
EXPLORE_EVERY = 8  # rounds


class ChainLength:
    """The next chain's length, between 1 and `most`."""

    def __init__(self, most: int):
        self.most = max(1, most)
        # Per depth d (index d): rounds whose chain drafted a d-th token after keeping the ones
        # before it (`tried`), and of those the rounds that kept it (`kept`).
        self.tried = [0] * (self.most + 1)
        self.kept = [0] * (self.most + 1)
        self.draft_call_seconds: float | None = None
        self.verify_seconds: dict[int, float] = {}  # by tokens the target's forward ran
        self.rounds = 0
        self.length = self.most  # until measured: the longest, so every depth gets tried

    def keep_chance(self, depth: int) -> float:
        """Chance that a chain keeps its `depth`-th token once it kept the ones before; an
        untried depth is as likely as the one before it."""
        if depth <= 1 and not self.tried[1]:
            return 0.5
        if not self.tried[depth]:
            return self.keep_chance(depth - 1)
        return (self.kept[depth] + 0.5) / (self.tried[depth] + 1.0)

    def verify_cost(self, tokens: int) -> float | None:
        """Seconds of a verify of `tokens` tokens, off the measured curve (verify_curve.py);
        None before anything was measured."""
        return cost_at(self.verify_seconds, tokens) if self.verify_seconds else None

    def seed(self, verify_seconds: dict[int, float]) -> None:
        """Start again from a measured curve of verify costs (the pair's calibration, at load and
        after a background compile changed the forward): rounds then refresh the sizes they run."""
        self.verify_seconds = dict(verify_seconds)

    def choose(self) -> int:
        """The next chain's length."""
        self.rounds += 1
        if self.draft_call_seconds is None or not self.verify_seconds:
            return self.length
        best, best_rate, expected, reach = 1, 0.0, 1.0, 1.0
        for length in range(1, self.most + 1):
            reach *= self.keep_chance(length)
            expected += reach
            rate = expected / (length * self.draft_call_seconds + self.verify_cost(length + 1))
            if rate > best_rate:
                best, best_rate = length, rate
        self.length = best
        if self.rounds % EXPLORE_EVERY == 0:
            # one token longer where it can be, else shorter: the neighbour's figures stay fresh
            return best + 1 if best < self.most else max(best - 1, 1)
        return best

    def record(self, drafted: int, kept: int, draft_calls: int, draft_seconds: float, verify_tokens: int,
               verify_seconds: float) -> None:
        """A verified round: it drafted `drafted` tokens and the target kept the first `kept`."""
        for depth in range(1, min(drafted, kept + 1, self.most) + 1):
            self.tried[depth] += 1
            self.kept[depth] += depth <= kept
        if draft_calls:
            self.draft_call_seconds = _blend(self.draft_call_seconds, draft_seconds / draft_calls)
        if 0 < verify_tokens <= self.most + 1:  # not a round that also read a prompt
            self.verify_seconds[verify_tokens] = _blend(self.verify_seconds.get(verify_tokens), verify_seconds)


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
