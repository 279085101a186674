"""The length of `auto`'s chains, chosen from measured costs and acceptance."""
from __future__ import annotations

import random

import pytest

from engine.drafters.chain_length import EXPLORE_EVERY, ChainLength


def run_rounds(length: ChainLength, keep_chance: float, call_s: float, verify_s, rounds: int, seed: int = 0) -> list[int]:
    """Rounds of a draft that keeps each token with `keep_chance` (once it kept the ones
    before), whose calls cost `call_s` and whose verify of n tokens costs verify_s(n)."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(rounds):
        drafted = length.choose()
        chosen.append(drafted)
        kept = 0
        while kept < drafted and rng.random() < keep_chance:
            kept += 1
        length.record(drafted, kept, drafted, drafted * call_s, drafted + 1, verify_s(drafted + 1))
    return chosen


def test_a_costly_verify_and_a_weak_draft_make_short_chains():
    """The demo pair on the 2-core CPU: a head call ~1 ms, a step ~6.5 ms, each verified token
    ~0.4 ms more, the first token kept ~55% of the time."""
    length = ChainLength(6)
    chosen = run_rounds(length, 0.5, 0.001, lambda n: 0.0065 + 0.0004 * n, 400)
    assert chosen[0] == 6  # until measured, the longest: every depth gets tried
    settled = [c for i, c in enumerate(chosen[200:], start=201) if i % EXPLORE_EVERY]
    assert max(settled) <= 2 and length.length <= 2


def test_a_flat_verify_and_a_strong_draft_make_the_longest_chains():
    """A GPU: verifying 8 tokens costs what 1 does, and the draft is mostly right."""
    length = ChainLength(6)
    run_rounds(length, 0.9, 0.0005, lambda n: 0.003, 200)
    assert length.length == 6


def test_a_draft_that_gets_better_makes_chains_longer():
    length = ChainLength(6)
    run_rounds(length, 0.3, 0.001, lambda n: 0.0065 + 0.0004 * n, 200)
    short = length.length
    run_rounds(length, 0.95, 0.001, lambda n: 0.0065 + 0.0004 * n, 400, seed=1)
    assert short == 1 and length.length >= 4


def test_every_few_rounds_a_neighbouring_length_is_measured():
    length = ChainLength(6)
    chosen = run_rounds(length, 0.5, 0.001, lambda n: 0.0065 + 0.0004 * n, 8 * EXPLORE_EVERY)
    explored = {chosen[i - 1] for i in range(EXPLORE_EVERY, len(chosen) + 1, EXPLORE_EVERY)}
    assert explored - {length.length}  # a length beside the choice was tried
    assert len(length.verify_seconds) >= 2


def test_rounds_that_read_a_prompt_leave_the_verify_costs_alone():
    length = ChainLength(4)
    length.record(2, 1, 2, 0.002, 300, 0.2)  # the target read a 298-token prompt with the chain
    assert length.verify_seconds == {}


# A weight-random Llama-3.1-8B shape at 4 bits on 2 cores, as measured before the int4 product
# fetched its weights ahead (docs/BENCHMARKS.md): a verify of 2 tokens costs what a step does,
# one of 4 half as much again.
EIGHT_B_CURVE = {1: 0.12, 2: 0.12, 4: 0.18, 8: 0.32, 16: 0.47}


def test_a_length_seeded_with_the_pairs_verify_curve_shortens_its_chains_after_one_round():
    seeded, bare = ChainLength(4), ChainLength(4)
    seeded.seed(EIGHT_B_CURVE)
    for length in (seeded, bare):
        assert length.choose() == 4  # no draft call timed yet: the longest
        length.record(4, 2, 4, 4 * 0.003, 5, 0.2)  # kept 2 of 4
    assert seeded.choose() == 2  # 1 + 0.75 + 0.56 tokens for 0.156 s beats 4 tokens' 0.212 s
    # Without the curve every length is priced like the one verify it saw, so it stays long.
    assert bare.choose() >= 3


def test_seeding_again_replaces_what_the_rounds_measured():
    length = ChainLength(4)
    length.record(3, 1, 3, 0.009, 4, 0.5)
    length.seed(EIGHT_B_CURVE)
    assert length.verify_seconds == EIGHT_B_CURVE
    assert length.verify_cost(3) == pytest.approx(0.15)  # halfway between 2 and 4 tokens
