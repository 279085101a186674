"""What a pair's heads card says about SPRINTER's verifier, in figures and in words, for the
terminal chat and the app alike (the card is written by `tandem calibrate`)."""
from __future__ import annotations

import shlex


def sprinter_figures(card: dict | None, greedy: bool) -> dict | None:
    """SPRINTER's held-out figures for the decoding mode a reply uses; None without a card."""
    mode = "greedy" if greedy else "sampled"
    try:
        sprinter = card["modes"][mode]["sprinter"]
        return {
            "mode": mode,
            "false_positive_rate": float(sprinter["false_positive_rate"]),
            "pass_rate": float(sprinter["pass_rate"]),
            "accuracy": float(sprinter["accuracy"]),
            "constant_accuracy": float(sprinter["constant_accuracy"]),
        }
    except (KeyError, TypeError, ValueError):
        return None


def describe_sprinter(figures: dict | None) -> str:
    """The figures in plain words: how much of what the target would reject slips through,
    and how often the verifier is right next to always giving the commoner answer."""
    if not figures:
        return "no held-out figures"
    return (f"lets through {figures['false_positive_rate']:.0%} of the tokens the target would reject; "
            f"right {figures['accuracy']:.0%} of the time (always guessing the commoner answer: "
            f"{figures['constant_accuracy']:.0%})")


def sprinter_refusal(pair_name: str, has_draft_model: bool, heads_problem: str | None, offered: tuple[str, ...]) -> str | None:
    """Why a pair cannot reply with SPRINTER, and what fixes it; None when it can."""
    if "sprinter" in offered:
        return None
    if not has_draft_model:
        return f"SPRINTER needs a draft model, and the pair {pair_name!r} drafts with n-grams."
    if heads_problem:
        return f"SPRINTER cannot run on the pair {pair_name!r}: {heads_problem}"
    return (f"SPRINTER needs heads calibrated for the pair {pair_name!r}, and it has none yet. Calibrate them "
            f"(it takes minutes) with Calibrate heads in the app's Settings, or: tandem calibrate --pair {shlex.quote(pair_name)}")
