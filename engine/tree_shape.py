"""`auto` tree shape: budget and depth chosen each round from what this device and this
conversation have shown, not from a constant (a budget that suits a GPU, where verifying 64
tokens costs what 1 does, is wrong on a 2-core CPU, and the reverse).

- Verify cost: seconds of one target forward over n tree tokens, measured once per pair at
  a few sizes (`calibrate`) and then refreshed from every round.
- Acceptance: the draft's path probability of each node predicts its chance of being
  accepted; a per-depth factor, learnt from the rounds so far, corrects the draft's
  over- or under-confidence.
- Budget: of the candidate nodes, best first, the prefix that maximises expected tokens
  per second of the round. Depth: one more draft call is worth it while the chance of
  reaching that depth, per second of draft call, beats the current tokens per second.
- Whether to draft at all: only while tree rounds have been yielding more tokens per second
  than plain target steps would. Where a weak draft meets a costly verify (a small CPU),
  rounds become plain steps, so trees never make a reply slower than the target alone;
  every EXPLORE_EVERY rounds one tree round checks whether that still holds.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from .drafters.tree_drafter import TreeRound, TreeShape
from .drafters.verify_curve import cost_at

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
SMOOTHING = 0.2  # weight of the newest measurement in running averages
EXPLORE_EVERY = 16  # rounds


class FixedTreeShape:
    """The same budget and depth every round."""

    calibrated = True

    def __init__(self, shape: TreeShape):
        self._shape = shape

    def calibrate(self, measure: Callable[[int], float]) -> None:
        pass

    def speculate(self) -> bool:
        return True

    def shape(self) -> TreeShape:
        return self._shape

    def choose_budget(self, candidates: list[tuple[int, float]]) -> int:
        return len(candidates)

    def record(self, observed: TreeRound) -> None:
        pass


class AutoTreeShape:
    def __init__(self, max_budget: int = 64, max_depth: int = 8, branching: int = 3, beam: int = 3, start_depth: int = 4):
        self.max_budget = max_budget
        self.max_depth = max_depth
        self.branching = branching
        self.beam = beam
        self.depth = start_depth
        self.verify_seconds: dict[int, float] = {}
        self.draft_call_seconds: float | None = None
        # Running averages over tree rounds (drafted), and the seconds of a plain round.
        self.round_seconds: float | None = None
        self.round_tokens: float | None = None
        self.plain_round_seconds: float | None = None
        self.rounds = 0
        self.plain_rounds = 0
        # Per depth d (index d): rounds whose tree reached d, rounds whose accepted path did,
        # and the summed predicted acceptance of the nodes at d.
        self.offered = [0] * (max_depth + 2)
        self.reached = [0] * (max_depth + 2)
        self.predicted = [0.0] * (max_depth + 2)

    @property
    def calibrated(self) -> bool:
        return bool(self.verify_seconds)

    def calibrate(self, measure: Callable[[int], float]) -> None:
        """`measure(n)`: seconds of one target forward over n tree tokens."""
        measure(CALIBRATION_SIZES[-1])  # warm-up: first calls allocate
        for size in CALIBRATION_SIZES:
            if size <= self.max_budget + 1:
                self.verify_seconds[size] = min(measure(size), measure(size))

    def speculate(self) -> bool:
        """Draft this round? Yes until tree rounds have been measured; then while they beat
        plain steps (a plain step costs one verified token until plain rounds are timed), and
        every EXPLORE_EVERY rounds regardless."""
        tree_rate = self._tree_rate()
        if tree_rate is None:
            return True
        if tree_rate > (self._plain_rate() or 1.0 / self.verify_cost(1)):
            return True
        return self.rounds % EXPLORE_EVERY == 0

    def _tree_rate(self) -> float | None:
        """Tokens per second of drafted rounds so far; None before one was timed."""
        return self.round_tokens / self.round_seconds if self.round_seconds and self.round_tokens else None

    def _plain_rate(self) -> float | None:
        """Tokens per second of plain steps so far; None before one was timed."""
        return 1.0 / self.plain_round_seconds if self.plain_round_seconds else None

    def calibrate_like(self, other: AutoTreeShape) -> None:
        """Take `other`'s calibration: the verify cost belongs to the target and the device,
        not to the method."""
        self.verify_seconds = dict(other.verify_seconds)

    def shape(self) -> TreeShape:
        return TreeShape(budget=self.max_budget, depth=self.depth, branching=self.branching, beam=self.beam)

    def verify_cost(self, tokens: int) -> float:
        if not self.verify_seconds:
            return 1.0  # uncalibrated: a flat cost, so only acceptance matters
        return cost_at(self.verify_seconds, tokens)

    def acceptance_factor(self, depth: int) -> float:
        # Smoothed toward 1 (trust the draft) until rounds have been seen at this depth.
        if depth >= len(self.reached):
            return 1.0
        return (self.reached[depth] + 1.0) / (self.predicted[depth] + 1.0)

    def choose_budget(self, candidates: list[tuple[int, float]]) -> int:
        """How many of `candidates` ((depth, score), best first) to verify."""
        draft_seconds = (self.draft_call_seconds or 0.0) * self.depth
        expected, best, best_rate = 1.0, len(candidates), 0.0
        for count, (depth, score) in enumerate(candidates, start=1):
            expected += min(1.0, self.acceptance_factor(depth) * math.exp(score))
            rate = expected / (draft_seconds + self.verify_cost(count + 1))
            if rate > best_rate:
                best, best_rate = count, rate
        return best

    def reach_probability(self, depth: int) -> float:
        """Chance that a round's accepted path reaches `depth`; unseen depths extrapolate the
        decay of the last two seen ones. Never above the chance of reaching the depth before:
        a path that reaches it went through that one, and the deep levels are seen in few
        rounds, where one lucky round would otherwise read as a high chance."""
        if depth <= 0:
            return 1.0
        previous = self.reach_probability(depth - 1)
        if self.offered[depth]:
            return min(previous, (self.reached[depth] + 0.5) / (self.offered[depth] + 1.0))
        before = self.reach_probability(depth - 2)
        return previous * (previous / before if before > 0 else 0.0)

    def record(self, observed: TreeRound) -> None:
        """Learn from one verified round; then choose the next round's depth."""
        depths, scores, accepted_depth = observed.depths, observed.scores, observed.accepted_depth
        for depth in range(1, max(depths) + 1):
            self.offered[depth] += 1
            if depth <= accepted_depth:
                self.reached[depth] += 1
        for depth, score in zip(depths[1:], scores[1:]):
            self.predicted[depth] += min(1.0, math.exp(score))
        self.rounds += 1
        plain = max(depths) == 0  # the root alone was verified
        self.plain_rounds += plain
        if observed.learn_costs:
            if observed.draft_calls:
                self.draft_call_seconds = _blend(self.draft_call_seconds, observed.draft_seconds / observed.draft_calls)
            if self.verify_seconds:
                # Keep the calibrated curve's shape but follow the level real rounds show
                # (a busier machine, a longer context): scale all of it.
                scale = _blend(1.0, observed.verify_seconds / self.verify_cost(observed.verify_tokens))
                self.verify_seconds = {size: seconds * scale for size, seconds in self.verify_seconds.items()}
            if plain:
                self.plain_round_seconds = _blend(self.plain_round_seconds, observed.round_seconds)
            else:
                self.round_seconds = _blend(self.round_seconds, observed.round_seconds)
                self.round_tokens = _blend(self.round_tokens, float(observed.tokens))
        self.depth = self._next_depth()

    def describe(self) -> dict:
        """What this shape has learnt so far, for reports: where a round's time goes and how
        deep its accepted paths reach."""
        return {
            "verify_ms_by_tokens": {size: seconds * 1000 for size, seconds in sorted(self.verify_seconds.items())},
            "draft_call_ms": self.draft_call_seconds * 1000 if self.draft_call_seconds else None,
            "rounds": self.rounds,
            "plain_rounds": self.plain_rounds,
            "tree_round_ms": self.round_seconds * 1000 if self.round_seconds else None,
            "tree_round_tokens": self.round_tokens,
            "plain_round_ms": self.plain_round_seconds * 1000 if self.plain_round_seconds else None,
            "depth": self.depth,
            "reach_by_depth": [self.reached[d] / self.offered[d] for d in range(1, len(self.offered)) if self.offered[d]],
        }

    def _next_depth(self) -> int:
        tree_rate = self._tree_rate()
        if not self.draft_call_seconds or tree_rate is None:
            return self.depth
        # A deeper level is worth a draft call only if it promises more tokens per second
        # than decoding gets now: the better of tree rounds and plain steps. (Against slow
        # tree rounds alone, even a rarely reached level looks worth it.)
        tokens_per_second = max(tree_rate, self._plain_rate() or 0.0)
        depth = 1
        while depth < self.max_depth and self.reach_probability(depth + 1) / self.draft_call_seconds > tokens_per_second:
            depth += 1
        if self.rounds % EXPLORE_EVERY == 0:
            # Now and then one level deeper than the estimate says, so that a depth given up
            # early keeps being measured instead of judged by stale numbers.
            depth = min(depth + 1, self.max_depth)
        return depth


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
