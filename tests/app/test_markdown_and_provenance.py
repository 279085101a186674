"""Splitting replies into prose and code, and provenance runs."""
from __future__ import annotations

from app.markdown_blocks import Block, split_blocks, with_fences_closed
from app.provenance import coloured_html, extend_runs, fit_runs, split_delta
from engine.events import Provenance, TextDelta


def test_code_fences_become_their_own_blocks_even_half_streamed():
    text = "Intro\n\n```python\nprint(1)\n```\nAfter\n\n~~~\nopen"
    assert split_blocks(text) == [
        Block("prose", "Intro"),
        Block("code", "print(1)", "python", fence="```"),
        Block("prose", "After"),
        Block("code", "open", "", closed=False, fence="~~~"),
    ]


def test_prose_is_split_at_new_paragraphs_so_a_streaming_reply_lays_out_only_its_last():
    text = "First, a paragraph\nof two lines.\n\n# A heading\n\n- a list\n- tight\n\n- then loose\n\n  continued\n\n1. one\n\n2. two\n\nEnd"
    assert [block.text for block in split_blocks(text)] == [
        "First, a paragraph\nof two lines.",
        # A list stays with what comes before it, and a loose list's items and their indented
        # continuations together: apart, a numbered list would restart its numbers and a
        # continuation would lose its item.
        "# A heading\n\n- a list\n- tight\n\n- then loose\n\n  continued\n\n1. one\n\n2. two",
        "End",
    ]
    assert "".join(block.text for block in split_blocks("Half a paragr")) == "Half a paragr"


def test_a_code_block_left_open_is_closed_with_its_own_fence():
    assert with_fences_closed("Look:\n\n````sh\nls\n```\nrm\n") == "Look:\n\n````sh\nls\n```\nrm\n````"
    closed = "Look:\n\n~~~\nls\n~~~\nDone."
    assert with_fences_closed(closed) == closed


def test_a_delta_is_shared_among_its_tokens_at_word_starts():
    delta = TextDelta(" the cat sat", (1, 2, 3), (Provenance.DRAFT, Provenance.DRAFT, Provenance.TARGET))
    assert split_delta(delta) == [("draft", " the"), ("draft", " cat"), ("target", " sat")]
    runs = extend_runs([], split_delta(delta))
    assert runs == [("draft", 8), ("target", 4)]


def test_runs_are_fitted_to_the_final_text_and_coloured_with_whitespace_kept():
    assert fit_runs([("draft", 3), ("target", 3)], 4) == [("draft", 3), ("target", 1)]
    assert fit_runs([("draft", 3)], 5) == [("draft", 5)]
    html = coloured_html("a <b>\n c", [("draft", 2), ("target", 7)], dark=False)
    assert "&lt;b&gt;" in html and "pre-wrap" in html and html.count("<span") == 2


def test_unchecked_tokens_have_their_own_tint_and_legend_entry():
    from app.provenance import DARK_COLOURS, LEGEND, LIGHT_COLOURS

    for colours in (LIGHT_COLOURS, DARK_COLOURS):
        assert set(colours) == {kind.value for kind in Provenance}
        assert len(set(colours.values())) == len(colours)  # no two kinds share a tint
    meaning = dict(LEGEND)[Provenance.UNCHECKED.value]
    assert "SPRINTER" in meaning and "approximate" in meaning
    html = coloured_html("ab", [("unchecked", 1), ("target", 1)], dark=False)
    assert LIGHT_COLOURS["unchecked"] in html
