"""What a model pair load is doing, step by step, with the seconds each step has taken so far:
the status bar's loading line. A first start prepares the demo model once, which can take
half a minute; a line that counts shows the app is working, and the engine's message for a
slow step says how long to expect (engine/models.py)."""
from __future__ import annotations

import time
from collections.abc import Callable


class LoadSteps:
    def __init__(self, first_message: str, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.started = clock()
        self.steps: list[tuple[str, float]] = [(first_message, self.started)]  # (message, when it began)

    def report(self, message: str) -> None:
        """The engine's progress message; a repeated one (a fraction update) is the same step."""
        if message != self.steps[-1][0]:
            self.steps.append((message, self.clock()))

    def line(self) -> str:
        """'Converting the demo model (first start only, about 20–25 s)… 12 s'"""
        message, began = self.steps[-1]
        return f"{message} {int(self.clock() - began)} s"

    def history(self) -> str:
        """Every step so far, one a line, with the seconds it took."""
        ends = [began for _message, began in self.steps[1:]] + [self.clock()]
        return "\n".join(f"{message} {int(end - began)} s" for (message, began), end in zip(self.steps, ends))

    def total_s(self) -> float:
        return self.clock() - self.started
