"""How a reply's decoding is named under it and in the speed panel."""
from __future__ import annotations

from app.figures import decoding_mode

BLOCK = "Exact — block verification"


def test_chains_name_their_draft_length_and_verifier():
    chain = {"method": "chain", "draft_tokens": 4, "temperature": 0.7}
    assert decoding_mode(chain, BLOCK) == f"chain, K=4, {BLOCK}, temperature 0.7"
    assert decoding_mode({"method": "ar", "draft_tokens": 4, "temperature": 0}, BLOCK) == "ar, greedy"


def test_trees_name_their_shape_and_no_chain_settings():
    # Trees take no K and accept by one target sample per node, whatever verifier is set.
    auto = {"method": "tree", "draft_tokens": 4, "tree_shape": "auto", "temperature": 0}
    fixed = {"method": "staged", "draft_tokens": 4, "tree_shape": "16x4", "temperature": 0.7, "top_p": 0.9}
    assert decoding_mode(auto, BLOCK) == "tree, auto shape, greedy"
    assert decoding_mode(fixed, BLOCK) == "staged, 16x4 tree, temperature 0.7, top-p 0.9"


def test_head_methods_are_named_with_their_own_knobs_and_sprinter_as_approximate():
    from app.figures import compact_line, detail_rows

    adaptive = {"method": "adaptive", "adaptive_max_tokens": 16, "draft_tokens": 4, "temperature": 0.7}
    sprinter = {"method": "sprinter", "sprinter_max_unchecked": 16, "draft_tokens": 4, "temperature": 0}
    assert decoding_mode(adaptive, BLOCK) == f"adaptive chain (SpecDec++), up to 16 drafted, {BLOCK}, temperature 0.7"
    assert decoding_mode(sprinter, BLOCK) == "SPRINTER (approximate), up to 16 unchecked in a row, greedy"

    stats = {"tokens_generated": 40, "unchecked_tokens": 30, "target_calls_skipped": 2, "exact": False,
             "mean_accepted_per_target_call": 5.0}
    quality = {"mode": "greedy", "false_positive_rate": 0.098, "pass_rate": 0.6, "accuracy": 0.87, "constant_accuracy": 0.74}
    figures = {"stats": stats, "decoding": sprinter, "quality": quality}
    assert "75% unchecked" in compact_line(figures)
    rows = dict(detail_rows(figures))
    assert rows["Verifier"] == "SPRINTER (approximate)"
    assert rows["Unchecked tokens"] == "75% (30 of 40 tokens never seen by the target)"
    assert rows["Held-out quality"] == (
        "lets through 10% of the tokens the target would reject; right 87% of the time "
        "(always guessing the commoner answer: 74%)"
    )
    # A reply saved before SPRINTER existed has no `exact` and was exact.
    assert dict(detail_rows({"stats": {"tokens_generated": 3}, "decoding": {"method": "chain"}}))["Verifier"] == "Exact"


def test_the_pair_line_names_an_eagle_head_where_the_pair_drafts_with_one():
    from app.figures import detail_rows

    pair = {"name": "demo", "target": "demo-target", "draft": "smollm2-135m-draft", "device": "cpu", "precision": "int8"}
    figures = {"stats": {"tokens_generated": 3}, "decoding": {"method": "eagle"}}
    with_head = dict(detail_rows({**figures, "pair": {**pair, "eagle": "smollm2-135m-eagle3"}}))
    assert with_head["Pair"] == "demo: demo-target + smollm2-135m-draft + EAGLE-3 head smollm2-135m-eagle3"
    assert dict(detail_rows({**figures, "pair": {**pair, "eagle": None}}))["Pair"] == "demo: demo-target + smollm2-135m-draft"
