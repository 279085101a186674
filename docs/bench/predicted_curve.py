"""The speedup a chain of K drafted tokens can reach on a device, against the acceptance rate,
from a cost table `tandem bench --record-costs` wrote there (issue 47: the predicted curve for
the H100's tables).

Each drafted token is kept with probability `a` given the one before it was (a constant
acceptance by depth), so a round of K drafts writes (1 - a^(K+1)) / (1 - a) tokens on average
and costs K draft calls and one target forward over K + 1 tokens; plain decoding writes one
token per one-token forward. Prints, per acceptance, the best K and its speedup over plain
decoding. A floor on the device's time, as the bench's own predictions are: Python's time per
round is not in the table.

  .venv/bin/python docs/bench/predicted_curve.py docs/bench/h100-*costs*.json
"""
from __future__ import annotations

import json
import sys

ACCEPTANCES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MOST_DRAFTS = 8


def verify_ms(table: dict[int, float], tokens: int) -> float:
    """The table's cost of a forward over `tokens`, linear between its measured sizes."""
    sizes = sorted(table)
    below = max(size for size in sizes if size <= tokens)
    above = min((size for size in sizes if size >= tokens), default=sizes[-1])
    if above == below:
        return table[below]
    share = (tokens - below) / (above - below)
    return table[below] + share * (table[above] - table[below])


def best_chain(table: dict[int, float], draft_ms: float, acceptance: float) -> tuple[int, float]:
    step = table[1]
    best = (0, 1.0)
    for drafts in range(1, MOST_DRAFTS + 1):
        tokens = (1 - acceptance ** (drafts + 1)) / (1 - acceptance)
        speedup = tokens * step / (drafts * draft_ms + verify_ms(table, drafts + 1))
        if speedup > best[1]:
            best = (drafts, speedup)
    return best


def main() -> None:
    for path in sys.argv[1:]:
        costs = json.load(open(path))
        table = {int(size): ms for size, ms in costs["target_verify_ms"].items()}
        for drafter, draft_ms in costs["draft_call_ms"].items():
            print(f"{path}: {costs['device']}, drafter {drafter} ({draft_ms:.2f} ms a call, a step {table[1]:.2f} ms)")
            cells = [best_chain(table, draft_ms, acceptance) for acceptance in ACCEPTANCES]
            print("  acceptance  " + "  ".join(f"{a:5.1f}" for a in ACCEPTANCES))
            print("  best K      " + "  ".join(f"{k:5d}" for k, _ in cells))
            print("  speedup     " + "  ".join(f"{s:5.2f}" for _, s in cells))


if __name__ == "__main__":
    main()
