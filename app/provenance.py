"""Which characters of a reply came from the draft and which from the target (and, with
SPRINTER, which went out without the target checking them).

A reply's provenance is kept as runs, `[(kind, characters), ...]` in text order, so it is
small enough to save with every streamed delta and to colour a whole reply at once.
"""
from __future__ import annotations

import html

from engine.events import Provenance, TextDelta

Runs = list[tuple[str, int]]

# Readable on light and on dark palettes: tints behind the text, never the text colour itself.
LIGHT_COLOURS = {
    Provenance.DRAFT.value: "#c8efc8",
    Provenance.TARGET.value: "#ffe0b3",
    Provenance.BONUS.value: "#d9d2f7",
    Provenance.UNCHECKED.value: "#f7c6d3",
}
DARK_COLOURS = {
    Provenance.DRAFT.value: "#1f5a2a",
    Provenance.TARGET.value: "#6b4a12",
    Provenance.BONUS.value: "#463a7a",
    Provenance.UNCHECKED.value: "#6e2440",
}
# Short enough for the status bar beside the loaded pair's line; LEGEND_TIPS say it in full.
LEGEND = (
    (Provenance.DRAFT.value, "Drafted, accepted by the target"),
    (Provenance.TARGET.value, "Produced by the target"),
    (Provenance.BONUS.value, "Target's bonus token"),
    (Provenance.UNCHECKED.value, "Unchecked (SPRINTER, approximate)"),
)
LEGEND_TIPS = {
    Provenance.DRAFT.value: "Proposed by the draft and accepted by the target's verification",
    Provenance.TARGET.value: "Produced by the target itself, after it rejected a draft token (or in ar)",
    Provenance.BONUS.value: "The target's extra token after it accepted every draft token of a round",
    Provenance.UNCHECKED.value: (
        "SPRINTER (approximate): drafted and passed by the learned verifier; the target never checked it, "
        "so it may differ from what the target would have written"
    ),
}


def split_delta(delta: TextDelta) -> list[tuple[str, str]]:
    """Share a delta's text among its tokens: (kind, text) pieces in order.

    The engine's per-token pieces give this exactly. Deltas without them (older recordings)
    are divided in proportion to the token count, each boundary moved to the next word start
    when one is near.
    """
    text, kinds = delta.text, [kind.value for kind in delta.provenance]
    if not text:
        return []
    if len(delta.pieces) == len(kinds):  # the engine said exactly which text each token made
        return [(kind, piece) for kind, piece in zip(kinds, delta.pieces) if piece]
    if not kinds:
        return [(Provenance.TARGET.value, text)]
    pieces: list[tuple[str, str]] = []
    start = 0
    for index, kind in enumerate(kinds):
        end = len(text) if index == len(kinds) - 1 else _boundary(text, round(len(text) * (index + 1) / len(kinds)), start)
        if end > start:
            pieces.append((kind, text[start:end]))
        start = end
    return pieces


def _boundary(text: str, near: int, not_before: int) -> int:
    """`near`, or the start of the word that `near` falls inside when that is close by."""
    position = min(max(near, not_before), len(text))
    for back in range(4):
        candidate = position - back
        if candidate <= not_before:
            break
        if candidate < len(text) and text[candidate].isspace():
            return candidate
    return position


def extend_runs(runs: Runs, pieces: list[tuple[str, str]]) -> Runs:
    """Append pieces to runs in place, merging neighbours of the same kind."""
    for kind, piece in pieces:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + len(piece))
        else:
            runs.append((kind, len(piece)))
    return runs


def fit_runs(runs: Runs, length: int) -> Runs:
    """Runs that cover exactly `length` characters: the final text of a reply can differ
    from the streamed one by a held-back partial character."""
    fitted: Runs = []
    remaining = length
    for kind, count in runs:
        if remaining <= 0:
            break
        fitted.append((kind, min(count, remaining)))
        remaining -= count
    if remaining > 0:
        last_kind = fitted[-1][0] if fitted else Provenance.TARGET.value
        if fitted:
            fitted[-1] = (last_kind, fitted[-1][1] + remaining)
        else:
            fitted.append((last_kind, remaining))
    return fitted


def coloured_html(text: str, runs: Runs, dark: bool) -> str:
    """The reply as rich text with each run on its provenance tint; whitespace kept."""
    colours = DARK_COLOURS if dark else LIGHT_COLOURS
    parts = []
    position = 0
    for kind, count in fit_runs(runs, len(text)):
        piece = html.escape(text[position : position + count])
        parts.append(f'<span style="background-color:{colours[kind]}">{piece}</span>')
        position += count
    return '<div style="white-space: pre-wrap">' + "".join(parts) + "</div>"
