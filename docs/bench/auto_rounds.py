"""Where `auto`'s rounds go: `tandem bench` with every round of `auto` logged (candidate,
exploring or not, how far its models were behind, seconds, tokens, whether it counted for the
candidate's speed), then per candidate the counted and uncounted rounds' ms a token, and each
(candidate, exploring) pair's share of the decoding time. Used for the fifth session's fixes
to `auto` (docs/BENCHMARKS.md).

  PYTHONPATH=. .venv/bin/python docs/bench/auto_rounds.py bench --pair demo --methods auto -k 2 --limit 12
"""
from __future__ import annotations

import collections
import statistics
import sys

from engine.drafters import auto

rounds = []  # (candidate, exploring, behind, seconds, tokens, counted)
_propose, _finish_round = auto.MethodChooser.propose, auto.MethodChooser._finish_round


def propose(self, context, room, sampler):
    proposal = _propose(self, context, room, sampler)
    behind = [len(context) - len(runtime) for runtime in self.candidates[self.current].runtimes]
    self._logged = (self.current, self._exploring, max(behind, default=0))
    return proposal


def finish_round(self, seconds, tokens, counted):
    rounds.append((*self._logged, seconds, tokens, counted))
    return _finish_round(self, seconds, tokens, counted)


def report() -> None:
    grouped = collections.defaultdict(list)
    for name, _, behind, seconds, tokens, counted in rounds:
        grouped[(name, counted)].append((seconds, tokens, behind))
    for (name, counted), rows in sorted(grouped.items()):
        seconds, tokens = sum(row[0] for row in rows), sum(row[1] for row in rows)
        print(f"{name:10s} {'counted' if counted else 'not counted':11s} rounds {len(rows):4d}  "
              f"ms a token {1000 * seconds / max(tokens, 1):6.2f}  behind: median {statistics.median(row[2] for row in rows)}, "
              f"most {max(row[2] for row in rows)}")
    time = collections.Counter()
    for name, exploring, _, seconds, _, _ in rounds:
        time[f"{name}{' (exploring)' if exploring else ''}"] += seconds
    total = sum(time.values()) or 1.0
    print("share of decoding time: " + ", ".join(f"{name} {seconds / total:.1%}" for name, seconds in time.most_common()))


if __name__ == "__main__":
    auto.MethodChooser.propose, auto.MethodChooser._finish_round = propose, finish_round
    from engine.cli import main

    try:
        main(sys.argv[1:])
    finally:
        report()
