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
