"""`auto`: the fastest exact method for this pair on this machine, plain decoding included.

Every candidate is an exact method's drafter (`ar` drafts nothing), so whichever runs a
round, the reply is the target's own. Rounds are timed as they run: a running average of
seconds per token per candidate, kept across replies and across starts (a small JSON file in
the cache, per pair and machine).

With no record (the first start on a machine), plain decoding runs first, and each other
candidate, in the order it is given (methods.trial_order: chains first where wide verifies
cost more than a step, as on a CPU), is tried for TRIAL_ROUNDS rounds as what that costs allows: a trial round runs only
while the time trials have lost against the fastest tried so far (a round's time less what
the fastest would have taken for its tokens; a trial that is faster earns time back), plus one
more of the fastest's rounds, stays within TRIAL_SHARE of this process's decoding time. Where
drafting does not pay (a 135M target on 2 cores), trials cost about TRIAL_SHARE; where it
pays, the first trials of the faster method earn the others' at once. Trying every candidate
first, whatever it cost, had `auto` write 0.69-0.92x plain decoding's speed on short runs of
six kinds of task from a fresh start (docs/BENCHMARKS.md).

Once tried, the fastest runs, and every other candidate gets a round now and then, so a
machine that gets busier or a conversation that drafts better is noticed. Those exploring
rounds are paced by time, not by count, and by how much slower each candidate measures: of
the decoding time in this process, each of the n others gets LOSS_BUDGET / n / (its slowdown),
between EXPLORE_SHARE / n and MOST_SHARE, so a candidate that is much slower is checked less
often, one within a few percent often (a close call is cheap to check and easy to get wrong
from a few noisy rounds), and a round that costs more counts for what it costs.

A round whose drafter first caught up on the tokens written since it last ran (a draft model,
an EAGLE head) says nothing about its speed: it is not counted, and an exploring visit goes on
until one of its rounds counts (at most VISIT_ROUNDS). Counted, such rounds had sunk a rarely
run candidate's average for good: the EAGLE-3 head's chain kept a slow record that nothing
retried (docs/BENCHMARKS.md). A round that read a prompt is not counted either.

A record from an earlier start may no longer hold: the host was busier then, Tandem's kernels
or a drafter changed. So in each process the recorded fastest, the runner-up and plain
decoding first run RECHECK_ROUNDS rounds each, the others as their exploring comes due, and a
recorded average only orders them: this process's first round of a candidate replaces it, and
its first rounds are averaged alike (1, 1/2, 1/3, ... down to SMOOTHING). A stale record had
kept `auto` on a drafting method at 0.94x of plain decoding for a whole benchmark run, and
another on plain decoding where the EAGLE-3 chain ran 1.1x (docs/BENCHMARKS.md). Re-checking
every candidate at each start cost a short run 2-5%. And a drafting method replaces plain
decoding only when it measures PLAIN_MARGIN faster.

Where drafting does not pay (a weak draft on a 2-core CPU) the fastest is plain decoding, and
then `auto` costs at most about EXPLORE_SHARE: it never makes replies noticeably slower than
the target alone.

The averages choose; they do not make the "N× plain decoding" a reply says. That comes from
this process's recent rounds of both only, where they can carry it (speed_comparison.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from ..runtime import ModelRuntime
from ..sampling import Sampler
from .base import Drafter, Proposal, RoundOutcome
from .speed_comparison import TimedRound, compare, recent_rounds

PLAIN = "ar"
TRIAL_ROUNDS = 6  # rounds a candidate runs before its speed is trusted
# Of this process's decoding time, the most that trials of untried candidates may lose against
# the fastest tried one (the module's note)
TRIAL_SHARE = 0.01
RECHECK_ROUNDS = 4  # rounds the recorded fastest, runner-up and plain decoding run in each process first
# Each of the n candidates that are not the fastest gets LOSS_BUDGET / n / (its slowdown) of
# the decoding time, within EXPLORE_SHARE / n and MOST_SHARE: what exploring costs stays about
# LOSS_BUDGET, and at most EXPLORE_SHARE times the slowdown where all the others are much slower.
EXPLORE_SHARE = 0.01
MOST_SHARE = 0.25
LOSS_BUDGET = 0.005
# The weight of the newest round in a candidate's average, once it has a few this process. A
# round keeps 1 to 3 tokens, so its rate is noisy: at 0.1 (the last ~10 rounds) the demo pair's
# leader kept flipping between the EAGLE-3 chain (6.2 ms a token) and plain decoding (7.5) and
# `auto` ran plain decoding half the time; at 0.03 still 42% on the demo pair as shipped; at
# 0.01 an average rests on ~100 rounds, under a second there.
SMOOTHING = 0.01
# A drafting method runs instead of plain decoding only when it measures this much faster: a
# candidate's average rests on its last ~10 rounds, each keeping 1 to 5 tokens, and the demo
# pair's methods measured 0.82-1.07x plain decoding from run to run on this host, so a near
# tie went either way on the rounds' luck and lost up to 7% (docs/BENCHMARKS.md). Where
# drafting pays it pays far more than this.
PLAIN_MARGIN = 0.05
# The record is written every SAVE_EVERY rounds, at most once in SAVE_INTERVAL_S: a write costs
# ~0.4 ms, a tenth of a round of the demo target on the CPU's native forward.
SAVE_EVERY = 16
SAVE_INTERVAL_S = 2.0
# An exploring visit runs its candidate until one round counts (the first may catch up), at most:
VISIT_ROUNDS = 3


@dataclass
class SpeedRecord:
    """Per candidate: running averages of a round's seconds and tokens (their ratio is its
    throughput; averaging per-round rates would overweight rounds that wrote one token), and
    how many rounds they rest on. Overall: the seconds spent decoding, and how many of them
    went to exploring a candidate that was not the fastest."""

    path: Path | None = None
    round_seconds: dict[str, float] = field(default_factory=dict)
    round_tokens: dict[str, float] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    decoding_seconds: float = 0.0
    exploring_seconds: float = 0.0
    # Rounds per candidate in this process (not saved): its first ones weigh more
    fresh: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    # This process's decoding seconds, in all and per candidate explored (not saved): what
    # paces exploring. Here, not in the chooser, which each reply makes anew.
    decoding_here: float = field(default=0.0, repr=False, compare=False)
    explored_here: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    # What this process's trial rounds lost against the fastest tried candidate (not saved;
    # negative where the trials were faster): what paces the trials.
    trial_loss_here: float = field(default=0.0, repr=False, compare=False)
    # This process's newest counted rounds per candidate and when they ended (not saved): what
    # a "N× plain decoding" figure rests on (speed_comparison.py), not the averages above.
    recent: dict[str, deque[TimedRound]] = field(default_factory=dict, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    _saved_at: float = field(default=-math.inf, repr=False, compare=False)  # time.monotonic() of the last write

    @classmethod
    def load(cls, path: Path) -> SpeedRecord:
        """The record at `path`; an empty one when there is none or it cannot be read (it is
        a cache: measuring again is the worst case)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            record = cls(
                path,
                {name: float(value) for name, value in data["round_seconds"].items()},
                {name: float(value) for name, value in data["round_tokens"].items()},
                {name: int(value) for name, value in data["rounds"].items()},
                float(data.get("decoding_seconds", 0.0)),
                float(data.get("exploring_seconds", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls(path)
        names = set(record.round_seconds)
        if names != set(record.round_tokens) or names != set(record.rounds) or not all(
                seconds > 0 and record.round_tokens[name] > 0 for name, seconds in record.round_seconds.items()):
            return cls(path)  # not one this code wrote
        return record

    @property
    def seconds_per_token(self) -> dict[str, float]:
        return {name: self.round_seconds[name] / self.round_tokens[name] for name in self.round_seconds}

    def add(self, name: str, seconds: float, tokens: int) -> None:
        # this process's first rounds of a candidate: the mean of them (a loaded average only
        # ordered the candidates), until that weighs less than SMOOTHING
        weight = max(SMOOTHING, 1.0 / (self.fresh.get(name, 0) + 1))
        for averages, value in ((self.round_seconds, seconds), (self.round_tokens, float(tokens))):
            old = averages.get(name)
            averages[name] = value if old is None else (1 - weight) * old + weight * value
        self.rounds[name] = self.rounds.get(name, 0) + 1
        self.fresh[name] = self.fresh.get(name, 0) + 1
        self.recent.setdefault(name, recent_rounds()).append(TimedRound(self.clock(), seconds, tokens))
        if (self.path is not None and sum(self.rounds.values()) % SAVE_EVERY == 0
                and time.monotonic() - self._saved_at >= SAVE_INTERVAL_S):
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self._saved_at = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        data = {
            "round_seconds": self.round_seconds, "round_tokens": self.round_tokens, "rounds": self.rounds,
            "decoding_seconds": self.decoding_seconds, "exploring_seconds": self.exploring_seconds,
        }
        partial.write_text(json.dumps(data), encoding="utf-8")
        os.replace(partial, self.path)

    def spent(self, seconds: float, explored: str | None = None) -> None:
        """A round's `seconds`; `explored`: the candidate it explored, if it did."""
        self.decoding_seconds += seconds
        self.decoding_here += seconds
        if explored is not None:
            self.exploring_seconds += seconds
            self.explored_here[explored] = self.explored_here.get(explored, 0.0) + seconds

    def ranked(self, names: list[str]) -> list[str]:
        """`names`, fastest first, plain decoding ahead of any that is not PLAIN_MARGIN faster;
        unmeasured ones last, in their given order."""
        rates = self.seconds_per_token

        def rank(name: str) -> float:
            return rates[name] / (1 + PLAIN_MARGIN) if name == PLAIN else rates[name]

        measured = sorted((name for name in names if name in rates), key=rank)
        return measured + [name for name in names if name not in rates]


def record_path(cache: Path, pair_key: str, machine_key: str) -> Path:
    digest = hashlib.sha256(f"{pair_key}|{machine_key}".encode()).hexdigest()[:16]
    return cache / "auto-method" / f"{digest}.json"


class MethodChooser(Drafter):
    """Runs each round with the candidate that has been fastest here."""

    name = "auto"

    def __init__(self, candidates: dict[str, Drafter], record: SpeedRecord):
        if PLAIN not in candidates:
            raise ValueError("auto needs plain decoding among its candidates")
        self.candidates = candidates
        self.record = record
        self.lookahead = max(drafter.lookahead for drafter in candidates.values())
        self.current = PLAIN
        self._exploring = False
        self._catching_up = False  # whether this round's drafter first read what it had missed
        self._counted = True  # whether the last round counted for its candidate's speed
        self._visit_rounds = 0  # rounds of the exploring visit under way
        self._on_trial = False  # whether this round tries a candidate not yet tried
        self._previous: str | None = None  # the candidate of the reply's last round

    @property
    def runtimes(self) -> tuple[ModelRuntime, ...]:
        seen: dict[int, ModelRuntime] = {}
        for drafter in self.candidates.values():
            for runtime in drafter.runtimes:
                seen.setdefault(id(runtime), runtime)
        return tuple(seen.values())

    @property
    def prompt_runtimes(self) -> tuple[ModelRuntime, ...]:
        # Only the models of the candidate the next round will run: where plain decoding is
        # fastest, a draft model reading a long prompt for a round that never comes cost
        # every reply ~1.2 s on a 1,800-token prompt (docs/BENCHMARKS.md). A candidate run
        # later catches up then; that round's time counts against exploring, not its speed.
        # Never an exploring candidate's: reading the prompt is no round, so its time would
        # escape the exploring share.
        return self.candidates[self._next_choice(may_explore=False)[0]].prompt_runtimes

    def propose(self, context: list[int], room: int, sampler: Sampler) -> Proposal:
        self.current = self._choose()
        drafter = self.candidates[self.current]
        # Another candidate ran the last round (or another reply), and this one's models are
        # more than two rounds' worth behind: they first read what others wrote. (A candidate
        # can lag its own rounds by more, as `staged`'s draft model lags the n-gram tokens it
        # never read: those rounds count.)
        behind = [len(context) - len(runtime) for runtime in drafter.runtimes]
        self._catching_up = self._previous != self.current and max(behind, default=0) > 2 * (drafter.lookahead + 1)
        self._previous = self.current
        proposal = drafter.propose(context, room, sampler)
        proposal.drafted_by = self.current
        return proposal

    def observe(self, outcome: RoundOutcome) -> None:
        self.candidates[self.current].observe(outcome)
        read_a_prompt = outcome.target_tokens > len(outcome.proposal.tree)
        counted = bool(outcome.tokens) and not read_a_prompt and not self._catching_up
        self._finish_round(outcome.draft_s + outcome.target_s, len(outcome.tokens), counted)
        self.lookahead = max(drafter.lookahead for drafter in self.candidates.values())

    def _finish_round(self, seconds: float, tokens: int, counted: bool) -> None:
        """Account the round that `current` ran: its time, and its speed where it `counted`."""
        if self._on_trial:
            # against what the fastest tried would have taken for the same tokens; a round
            # that caught up (not counted) is charged whole: it is what trying cost
            rate = self.record.seconds_per_token.get(self._fastest_tried(), 0.0)
            self.record.trial_loss_here += seconds - tokens * rate
        self.record.spent(seconds, self.current if self._exploring else None)
        if counted:
            self.record.add(self.current, seconds, tokens)
        self._counted = counted

    def reset(self) -> None:
        for drafter in self.candidates.values():
            drafter.reset()

    def explain(self) -> str:
        """In plain words: what `auto` runs now, and why."""
        ranked = self.record.ranked(list(self.candidates))
        best = self._fastest_tried(ranked)
        if best is None or self.record.rounds.get(PLAIN, 0) < TRIAL_ROUNDS:
            return "auto: still measuring which method is fastest here"
        untried = self._untried(ranked)
        if untried and best == PLAIN:
            return f"auto: plain decoding, while it tries the other methods now and then ({len(untried)} to go)"
        if self._unchecked(ranked) is not None:
            return "auto: checking what an earlier start measured as fastest here"
        if best == PLAIN:
            return "auto: plain decoding, since drafting does not pay on this machine"
        # Not from the averages that chose it: those may rest on a few stalled rounds
        comparison = compare(self.record.recent.get(best, ()), self.record.recent.get(PLAIN, ()))
        if comparison is None:
            return f"auto: {best}, the fastest measured here (against plain decoding: measuring…)"
        return f"auto: {comparison.describe(best)}"

    def _choose(self) -> str:
        if self._exploring and not self._counted and self._visit_rounds < VISIT_ROUNDS:
            self._visit_rounds += 1  # the visit's rounds so far only caught up: one more
            return self.current
        name, self._exploring = self._next_choice()
        self._on_trial = self._exploring and self.record.rounds.get(name, 0) < TRIAL_ROUNDS
        self._visit_rounds = 1
        return name

    def _next_choice(self, may_explore: bool = True) -> tuple[str, bool]:
        """The candidate the next round runs, and whether that round explores."""
        ranked = self.record.ranked(list(self.candidates))
        fastest = self._fastest_tried(ranked)
        if fastest is None or self.record.rounds.get(PLAIN, 0) < TRIAL_ROUNDS:
            return PLAIN, False  # the reference first: what every trial is weighed against
        untried = self._untried(ranked)
        if untried and may_explore and self._trial_affordable(fastest):
            # the candidate on trial goes on while it may: its drafter has caught up
            return (self.current if self.current in untried else untried[0]), True
        unchecked = self._unchecked(ranked)
        if unchecked is not None:
            return unchecked, False
        explorer = self._owed_a_round(ranked) if may_explore else None
        if explorer is not None:
            return explorer, True
        return fastest, False

    def _untried(self, ranked: list[str]) -> list[str]:
        return [name for name in ranked if self.record.rounds.get(name, 0) < TRIAL_ROUNDS]

    def _fastest_tried(self, ranked: list[str] | None = None) -> str | None:
        """The fastest candidate with TRIAL_ROUNDS rounds behind it (plain decoding ahead of
        any that is not PLAIN_MARGIN faster), if any has them."""
        ranked = self.record.ranked(list(self.candidates)) if ranked is None else ranked
        return next((name for name in ranked if self.record.rounds.get(name, 0) >= TRIAL_ROUNDS), None)

    def _trial_affordable(self, fastest: str) -> bool:
        """Whether a trial round fits TRIAL_SHARE of this process's decoding time, with what
        trials lost so far and, to be safe, one more of the fastest's rounds (the median of its
        recent ones: one stalled round must not hold every trial off)."""
        recent = sorted(timed.seconds for timed in self.record.recent.get(fastest, ()))
        one_more = recent[len(recent) // 2] if recent else self.record.round_seconds.get(fastest, 0.0)
        return self.record.trial_loss_here + one_more <= TRIAL_SHARE * self.record.decoding_here

    def _owed_a_round(self, ranked: list[str]) -> str | None:
        """Of the tried candidates that are not the fastest, the one furthest below its share
        of this process's decoding time (the module's note), if that share already pays for one
        more of its rounds: so a process does not start by visiting every candidate."""
        rates = self.record.seconds_per_token
        tried = [name for name in ranked if self.record.rounds.get(name, 0) >= TRIAL_ROUNDS]
        others = tried[1:]
        fastest = rates.get(tried[0], 0.0) if tried else 0.0
        if not others or fastest <= 0:
            return None
        filled = {}
        for name in others:
            slowdown = rates[name] / fastest - 1
            share = min(MOST_SHARE, max(EXPLORE_SHARE, LOSS_BUDGET / max(slowdown, 1e-9)) / len(others))
            allowed = share * self.record.decoding_here
            one_more = self.record.explored_here.get(name, 0.0) + self.record.round_seconds[name]
            filled[name] = one_more / allowed if allowed else math.inf
        owed = min(filled, key=filled.get)
        return owed if filled[owed] <= 1 else None

    def _unchecked(self, ranked: list[str]) -> str | None:
        """Of a record from an earlier start, the recorded fastest, the runner-up or plain
        decoding that has not yet run RECHECK_ROUNDS rounds in this process (None: all have).
        The others are re-checked as exploring comes due: their first round replaces what the
        record says of them."""
        tried = [name for name in ranked if self.record.rounds.get(name, 0) >= TRIAL_ROUNDS]
        return next((name for name in (*tried[:2], PLAIN) if self.record.fresh.get(name, 0) < RECHECK_ROUNDS), None)
