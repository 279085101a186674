"""The garbage check's statistics: exact where they say so, and prompt by prompt."""
from __future__ import annotations

import math
import random

from app.soak_statistics import compare_above, compare_shift, compare_tails, hypergeometric, midranks


def test_the_hypergeometric_in_logarithms_equals_the_exact_binomials():
    for population, marked, drawn in [(650, 33, 500), (200, 12, 50), (50, 30, 30), (10, 0, 5)]:
        exact = [math.comb(marked, k) * math.comb(population - marked, drawn - k) / math.comb(population, drawn)
                 for k in range(min(marked, drawn) + 1)]
        assert all(math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-300) for ours, theirs in zip(hypergeometric(population, marked, drawn), exact))


def test_one_prompt_gives_fishers_exact_test():
    rng = random.Random(1)
    reference = [("p", rng.gauss(0.0, 1.0)) for _ in range(150)]
    method = [("p", rng.gauss(0.3, 1.0)) for _ in range(60)]
    tail = compare_tails(reference, method)

    marked = tail.reference_above + tail.method_above
    fisher = sum(math.comb(marked, k) * math.comb(210 - marked, 60 - k) for k in range(tail.method_above, min(marked, 60) + 1))
    assert math.isclose(tail.p_value, fisher / math.comb(210, 60), rel_tol=1e-9)
    assert tail.reference_count == 150 and tail.method_count == 60


def test_a_method_that_answered_only_the_hard_prompts_is_not_worse():
    # The hard prompt's replies score 3 nats, the easy one's 1: a method that only answered the
    # hard one is above every reference reply to the easy one, and no worse for it.
    rng = random.Random(2)
    reference = [(prompt, base + rng.gauss(0.0, 0.1)) for prompt, base in (("easy", 1.0), ("hard", 3.0)) for _ in range(40)]
    method = [("hard", 3.0 + rng.gauss(0.0, 0.1)) for _ in range(40)]

    assert compare_tails(reference, method).p_value > 1e-3
    assert compare_shift(reference, method).p_value > 1e-4  # the soak fails under ~1e-5
    unstratified = [("any", score) for _, score in reference], [("any", score) for _, score in method]
    assert compare_tails(*unstratified).p_value < 1e-3 and compare_shift(*unstratified).p_value < 1e-9  # pooled, it would look worse
    assert compare_above(reference, method, 2.0).p_value == 1.0  # only the hard prompt's replies compared
    worse = [(prompt, score + 0.3) for prompt, score in method]
    assert compare_shift(reference, worse).p_value < 1e-6


def test_every_reply_the_same_passes_and_a_method_wholly_above_fails():
    same = [("p", 1.0)] * 20
    assert compare_tails(same, [("p", 1.0)] * 30).p_value == compare_shift(same, [("p", 1.0)] * 30).p_value == 1.0
    assert compare_tails(same, [("p", 2.0)] * 30).p_value < 1e-12
    assert compare_above(same, [("p", 2.0)] * 30, 2.0).p_value < 1e-12
    assert midranks([3, 1, 2, 2, 5]) == [4.0, 1.0, 2.5, 2.5, 5.0]
