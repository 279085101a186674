""""N× plain decoding" is claimed only from rounds that can carry it: enough of both, taken
close together, robust to a stalled round, and never beyond what a method's tokens per round
allow (issue 45: a 2.7 tok/s reply on a busy machine said "tree, 102.33× plain decoding")."""
from __future__ import annotations

import re

import random

import pytest

from engine.drafters.auto import PLAIN, RECHECK_ROUNDS, TRIAL_ROUNDS, MethodChooser, SpeedRecord
from engine.drafters.base import NoDrafter
from engine.drafters.speed_comparison import (
    BOUND_SLACK, COMPARABLE_S, COMPARED_ROUNDS, MOST_COMPARED_ROUNDS, TimedRound, compare,
)


def rounds(seconds: list[float], tokens: int, start: float = 0.0) -> list[TimedRound]:
    """Rounds one after another from `start`, each keeping `tokens`."""
    timed, clock = [], start
    for each in seconds:
        clock += each
        timed.append(TimedRound(clock, each, tokens))
    return timed


def test_enough_rounds_of_both_give_the_figure_and_say_what_it_rests_on():
    plain = rounds([0.010] * COMPARED_ROUNDS, tokens=1)
    tree = rounds([0.012] * 20, tokens=3, start=plain[-1].ended_at)
    comparison = compare(tree, plain)
    assert comparison.factor == pytest.approx(0.010 / (0.012 / 3))
    assert comparison.rounds == COMPARED_ROUNDS  # as many of each side
    assert comparison.describe("tree") == (
        "tree, 2.50× plain decoding's speed on this machine (median of 8 recent rounds of each)")


def test_a_tiny_sample_of_either_side_claims_nothing():
    plain = rounds([0.010] * (COMPARED_ROUNDS - 1), tokens=1)
    tree = rounds([0.012] * 20, tokens=3, start=plain[-1].ended_at)
    assert compare(tree, plain) is None
    assert compare(tree[:COMPARED_ROUNDS - 1], rounds([0.010] * 20, tokens=1)) is None
    assert compare([], plain) is None and compare(tree, []) is None


def test_a_few_stalled_rounds_of_plain_decoding_move_the_figure_not_at_all():
    # Three of ten plain rounds caught a busy neighbour's time slice: 10 s instead of 10 ms.
    stalled = [0.010] * 10
    stalled[2] = stalled[5] = stalled[8] = 10.0
    plain = rounds(stalled, tokens=1)
    tree = rounds([0.012] * 10, tokens=3, start=plain[-1].ended_at)
    assert compare(tree, plain).factor == pytest.approx(2.5)


def test_plain_decoding_measured_under_a_stall_cannot_make_a_method_look_many_times_faster():
    # Every plain round ran while the machine was taken (what the median cannot see through):
    # 1 s a token against the method's 10 ms rounds of 2 tokens, "200×". A round of an exact
    # method calls the target once at least, so it is at most 2× faster: withheld.
    plain = rounds([1.0] * 12, tokens=1)
    chain = rounds([0.010] * 12, tokens=2, start=plain[-1].ended_at)
    assert compare(chain, plain) is None
    # Within what its tokens per round allow (and the medians' noise), it is claimed.
    chain_per_token = 0.010 / 2
    assert compare(chain, rounds([chain_per_token * 2.2] * 12, tokens=1)).factor == pytest.approx(2.2)
    assert compare(chain, rounds([chain_per_token * 2 * BOUND_SLACK * 1.01] * 12, tokens=1)) is None


def test_rounds_taken_far_apart_are_not_compared():
    plain = rounds([0.010] * 12, tokens=1)
    later = rounds([0.012] * 12, tokens=3, start=plain[-1].ended_at + COMPARABLE_S + 1)
    assert compare(later, plain) is None
    soon = rounds([0.012] * 12, tokens=3, start=plain[-1].ended_at + COMPARABLE_S / 2)
    assert compare(soon, plain) is not None


@pytest.mark.parametrize("seed", range(20))
def test_no_mix_of_stalls_and_tiny_samples_claims_more_than_the_tokens_per_round_allow(seed):
    generator = random.Random(seed)
    for _ in range(200):
        plain_cost, kept = generator.uniform(0.005, 0.5), generator.randint(1, 4)
        # an exact method's round: one target call on its draft, plus drafting
        method_cost = plain_cost * generator.uniform(1.0, 1.6)
        stall = generator.choice([1.0, 10.0, 100.0, 1000.0])
        stalled_share = generator.random()  # a stretch of load may cover most of a side's rounds
        plain = rounds([plain_cost * (stall if generator.random() < stalled_share else 1.0)
                        for _ in range(generator.randint(1, 3 * COMPARED_ROUNDS))], tokens=1)
        method = rounds([method_cost * (stall if generator.random() < stalled_share / 4 else 1.0)
                         for _ in range(generator.randint(1, MOST_COMPARED_ROUNDS))],
                        tokens=kept, start=plain[-1].ended_at)
        comparison = compare(method, plain)
        if comparison is not None:
            assert comparison.factor <= kept * BOUND_SLACK
            assert comparison.rounds >= COMPARED_ROUNDS


# --- through `auto` --------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def play(auto: MethodChooser, clock: Clock, cost: dict[str, list[float]], kept: dict[str, int]) -> None:
    """One round as `observe` times it: the chosen candidate's next listed seconds (its last
    one repeats), the clock moved on by them."""
    name = auto.current = auto._choose()
    planned = cost[name]
    seconds = planned.pop(0) if len(planned) > 1 else planned[0]
    clock.now += seconds
    auto._finish_round(seconds, kept[name], counted=True)


def test_a_stalled_trial_of_plain_decoding_does_not_make_auto_claim_100x():
    # The busy machine: plain decoding's trial rounds take 0.3 s, but one stalled 60 s;
    # tree keeps 2 tokens a round of 0.5 s (4 tok/s). The running averages that choose the
    # method then say plain decoding costs ~10 s a token, "40× slower" than tree.
    clock = Clock()
    auto = MethodChooser({PLAIN: NoDrafter(), "tree": NoDrafter()}, SpeedRecord(clock=clock))
    cost = {PLAIN: [0.3, 0.3, 60.0, 0.3], "tree": [0.5]}
    kept = {PLAIN: 1, "tree": 2}
    for _ in range(2 * TRIAL_ROUNDS):
        play(auto, clock, cost, kept)
    rates = auto.record.seconds_per_token
    assert rates[PLAIN] / rates["tree"] > 30  # what the reply line claimed from
    explained = auto.explain()
    assert "×" not in explained
    assert explained == "auto: tree, the fastest measured here (against plain decoding: measuring…)"


def test_auto_claims_a_figure_once_both_have_enough_recent_rounds():
    clock = Clock()
    auto = MethodChooser({PLAIN: NoDrafter(), "tree": NoDrafter()}, SpeedRecord(clock=clock))
    kept = {PLAIN: 1, "tree": 3}
    cost = {PLAIN: [0.010], "tree": [0.012]}  # 2.5x
    while auto.record.rounds.get("tree", 0) < COMPARED_ROUNDS:  # plain decoding first, then tree's trial
        play(auto, clock, cost, kept)
    assert re.fullmatch(r"auto: tree, 2\.50× plain decoding's speed on this machine \(median of \d+ recent rounds of each\)",
                        auto.explain())
    # Plain decoding's rounds then age: a quarter of an hour of tree alone, and the figure waits
    # for plain decoding's next rounds.
    clock.now += 3 * COMPARABLE_S
    auto.record.add("tree", 0.012, 3)
    assert "measuring…" in auto.explain()


def test_a_record_from_an_earlier_start_carries_no_figure(tmp_path):
    # Another process measured tree at 2.5x under another load: this process's few rechecking
    # rounds are too few to say so again.
    earlier = SpeedRecord(tmp_path / "record.json")
    for _ in range(40):
        earlier.add(PLAIN, 0.010, 1)
        earlier.add("tree", 0.012, 3)
    earlier.save()
    clock = Clock()
    auto = MethodChooser({PLAIN: NoDrafter(), "tree": NoDrafter()}, SpeedRecord.load(tmp_path / "record.json"))
    auto.record.clock = clock
    for _ in range(2 * RECHECK_ROUNDS):
        play(auto, clock, {PLAIN: [0.010], "tree": [0.012]}, {PLAIN: 1, "tree": 3})
    assert auto.record.fresh == {PLAIN: RECHECK_ROUNDS, "tree": RECHECK_ROUNDS}
    assert auto.explain() == "auto: tree, the fastest measured here (against plain decoding: measuring…)"
