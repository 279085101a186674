"""The verify cost curve both the tree shapes and the chain lengths price rounds with."""
from __future__ import annotations

import pytest

from engine.drafters.verify_curve import cost_at

CURVE = {1: 0.010, 2: 0.012, 4: 0.020, 8: 0.030}


def test_measured_sizes_are_read_and_the_others_interpolated():
    assert cost_at(CURVE, 4) == 0.020
    assert cost_at(CURVE, 3) == pytest.approx(0.016)
    assert cost_at(CURVE, 6) == pytest.approx(0.025)


def test_past_the_largest_size_the_last_slope_goes_on_and_below_the_smallest_the_first_holds():
    assert cost_at(CURVE, 12) == pytest.approx(0.040)
    assert cost_at({2: 0.5, 4: 0.7}, 1) == 0.5
    assert cost_at({3: 0.4}, 9) == 0.4


def test_a_falling_curve_never_promises_a_cheaper_verify_than_it_measured():
    falling = {1: 0.010, 2: 0.008, 4: 0.009}
    assert cost_at(falling, 16) >= min(falling.values())
    assert cost_at({8: 0.02, 16: 0.01}, 64) == 0.02  # a falling last slope is taken as flat
