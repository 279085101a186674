"""The loading line: each step of a pair load with the seconds it has taken."""
from __future__ import annotations

from app.load_steps import LoadSteps


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_step_shows_its_own_seconds_and_the_history_keeps_them_all():
    clock = Clock()
    steps = LoadSteps("Loading “demo”…", clock)
    assert steps.line() == "Loading “demo”… 0 s"
    clock.now += 2.4
    steps.report("Converting the demo model (first start only, about 20–25 s)…")
    clock.now += 12.9
    assert steps.line() == "Converting the demo model (first start only, about 20–25 s)… 12 s"
    steps.report("Converting the demo model (first start only, about 20–25 s)…")  # a fraction update
    clock.now += 9.0
    steps.report("Loading weights…")
    clock.now += 1.0
    assert steps.history().splitlines() == [
        "Loading “demo”… 2 s",
        "Converting the demo model (first start only, about 20–25 s)… 21 s",
        "Loading weights… 1 s",
    ]
    assert int(steps.total_s()) == 25
