"""Attention on the CPU that gives a token the same bits in a verify of k tokens as in a
one-token step: the property that lets greedy speculation follow plain decoding exactly.

Why not one scaled_dot_product_attention call over all k tokens: torch's CPU attention
multiplies through the BLAS library, and MKL (torch's CPU build uses it) sums a block of
several query rows in another order than one row on AMD CPUs, and a key window of another
width in another order on any CPU (measured on a Zen 4: every row of an 8-token call
differed in its last bits from the same row alone). So each token attends on its own, over
exactly the rows it sees, in slot order: a step and a verify then make the same call with
the same shapes over the same keys, whatever else is in the batch and however wide the
cache's window is. A tree's token sees its ancestors' rows, which a chain's step sees too,
in the same order, so trees keep the property as well.

It is a torch operator (`tandem::exact_attention`) so that a compiled forward calls it as
one opaque node instead of tracing the per-token loop (whose shapes depend on the mask).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def exact_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float, cap: float | None = None
) -> torch.Tensor:
    """query (1, heads, n, d) over keys and values (1, kv_heads, window, d), with `mask`
    the additive (1, 1, groups * n, window) mask of `static_cache_forward._attend` (0 where
    a token sees a row, -inf elsewhere; its first n rows are the tokens'). Returns
    (1, heads, n, d)."""
    return torch.ops.tandem.exact_attention.default(query, keys, values, mask, scale, cap)


def _attend_each_token(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float, cap: float | None
) -> torch.Tensor:
    _, heads, count, dim = query.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    seen = mask[0, 0, :count] == 0  # (n, window)
    first, last, seen_count = _visible_spans(seen)
    out = torch.empty_like(query)
    for token in range(count):
        if last[token] - first[token] + 1 == seen_count[token]:  # a chain: one run of rows, read in place
            rows = slice(first[token], last[token] + 1)
        else:  # a tree's token: its ancestors' rows, gathered in slot order
            rows = seen[token].nonzero().flatten()
        token_keys, token_values = keys[:, :, rows], values[:, :, rows]
        token_query = query[:, :, token].reshape(1, kv_heads, groups, dim)  # the token's query heads, by key/value head
        out[:, :, token] = _one_token(token_query, token_keys, token_values, scale, cap).reshape(1, heads, dim)
    return out


def _visible_spans(seen: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """Each token's first and last visible row, and how many rows it sees."""
    as_int = seen.to(torch.int8)
    width = seen.shape[1]
    first = as_int.argmax(dim=1)
    last = width - 1 - as_int.flip(1).argmax(dim=1)
    return first.tolist(), last.tolist(), seen.sum(dim=1).tolist()


def _one_token(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, cap: float | None) -> torch.Tensor:
    """(1, kv_heads, groups, d) queries of one token over the (1, kv_heads, seen, d) rows it sees."""
    if cap is None:
        return F.scaled_dot_product_attention(query, keys, values, scale=scale)
    # Gemma 2's soft cap, as transformers' eager attention computes it
    scores = torch.tanh(query @ keys.transpose(2, 3) * scale / cap) * cap
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype) @ values


_operators = torch.library.Library("tandem", "FRAGMENT")
_operators.define("exact_attention(Tensor query, Tensor keys, Tensor values, Tensor mask, float scale, float? cap) -> Tensor")
_operators.impl("exact_attention", _attend_each_token, "CPU")


@torch.library.register_fake("tandem::exact_attention")
def _(query, keys, values, mask, scale, cap):
    return torch.empty_like(query)
