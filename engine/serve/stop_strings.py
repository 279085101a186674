"""A request's `stop` strings over streamed text: the reply ends before the first one, which
is not sent. A stop string can arrive split across deltas, so text that could be the start
of one is held back until the next delta shows whether it is."""
from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(stops)
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> str:
        """The text that can be sent now; sets `stopped` once a stop string has arrived."""
        if self.stopped:
            return ""
        held = self._held + text
        found = [index for index in (held.find(stop) for stop in self.stops) if index >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return held[: min(found)]
        keep = self._longest_partial_stop(held)
        self._held = held[len(held) - keep:]
        return held[: len(held) - keep]

    def flush(self) -> str:
        """What was held back, once the reply ended without completing a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_stop(self, text: str) -> int:
        """The length of the longest end of `text` that a stop string begins with."""
        longest = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
