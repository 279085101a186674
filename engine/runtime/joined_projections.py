"""Joining a decoder layer's int8 (or int4) projections that read the same input, for the static forward
(static_cache_forward.py), which runs them, and the native forward (native_forward.py), which
hands them to C as they are."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import int4_weights, int8_weights
from .int4_weights import Int4Linear
from .int8_weights import Int8Linear


@dataclass(frozen=True)
class JoinedProjections:
    """A layer's int8 or int4 projections that read the same input, joined into one matmul each
    (`join_rows`): 4 integer matmuls per layer instead of 7. None where they are not all int8
    or all int4."""

    qkv: Int8Linear | Int4Linear | None = None  # q, k and v side by side
    gate_up: Int8Linear | Int4Linear | None = None  # the MLP's gate and up side by side


def _joined(parts: list) -> Int8Linear | Int4Linear | None:
    if all(isinstance(part, Int8Linear) for part in parts):
        return int8_weights.join_rows(parts)
    if all(isinstance(part, Int4Linear) for part in parts):
        return int4_weights.join_rows(parts)
    return None


def joined_projections(layer: torch.nn.Module, qkv_fused_already: bool) -> JoinedProjections:
    attention, mlp = layer.self_attn, layer.mlp
    qkv = None
    if not qkv_fused_already:
        parts = [attention.q_proj, attention.k_proj, attention.v_proj]
        qkv = _joined(parts)
    # Every covered family's MLP but Phi-3's (whose gate_up_proj is joined already) computes
    # down(act(gate(x)) * up(x)); `joined_mlp` does the same over the joined pair.
    parts = [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    gate_up = _joined(parts)
    return JoinedProjections(qkv, gate_up)


def joined_mlp(mlp: torch.nn.Module, joined: JoinedProjections, x: torch.Tensor) -> torch.Tensor:
    """The layer's MLP of `x`, through its joined gate and up projections where it has them."""
    if joined.gate_up is None:
        return mlp(x)
    gate, up = joined.gate_up(x).chunk(2, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)
