"""What a target forward over n tokens costs, read off a few measured sizes: the curve the
automatic tree shapes and the measured chain lengths both price their rounds with."""
from __future__ import annotations

import bisect


def cost_at(verify_seconds: dict[int, float], tokens: int) -> float:
    """Seconds of a forward over `tokens` tokens: measured, or interpolated between the measured
    sizes either side, or past the largest, the last two sizes' slope extended (`verify_seconds`
    holds at least one size). Never decreasing, never below the cheapest measurement: on a GPU the
    curve is flat and noisy, and a negative slope extrapolated far would promise free forwards."""
    if tokens in verify_seconds:
        return verify_seconds[tokens]
    sizes = sorted(verify_seconds)
    at = bisect.bisect_left(sizes, tokens)
    if at == 0:
        return verify_seconds[sizes[0]]
    low = sizes[at - 1]
    high = sizes[at] if at < len(sizes) else sizes[-1]
    if high == low:  # past the largest size: extend the last slope
        if len(sizes) < 2:
            return verify_seconds[low]
        low, high = sizes[-2], sizes[-1]
    slope = max((verify_seconds[high] - verify_seconds[low]) / (high - low), 0.0)
    return max(verify_seconds[low] + slope * (tokens - low), min(verify_seconds.values()))
