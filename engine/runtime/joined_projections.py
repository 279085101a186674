"""Joining a decoder layer's int8 projections that read the same input, for the static forward
(static_cache_forward.py), which runs them, and the native forward (native_forward.py), which
hands them to C as they are."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .int8_weights import Int8Linear, join_rows


@dataclass(frozen=True)
class JoinedProjections:
    """A layer's int8 projections that read the same input, joined into one matmul each
    (`join_rows`): 4 integer matmuls per layer instead of 7. None where they are not int8."""

    qkv: Int8Linear | None = None  # q, k and v side by side
    gate_up: Int8Linear | None = None  # the MLP's gate and up side by side


def joined_projections(layer: torch.nn.Module, qkv_fused_already: bool) -> JoinedProjections:
    attention, mlp = layer.self_attn, layer.mlp
    qkv = None
    if not qkv_fused_already:
        parts = [attention.q_proj, attention.k_proj, attention.v_proj]
        qkv = join_rows(parts) if all(isinstance(part, Int8Linear) for part in parts) else None
    # Every covered family's MLP but Phi-3's (whose gate_up_proj is joined already) computes
    # down(act(gate(x)) * up(x)); `joined_mlp` does the same over the joined pair.
    parts = [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    gate_up = join_rows(parts) if all(isinstance(part, Int8Linear) for part in parts) else None
    return JoinedProjections(qkv, gate_up)


def joined_mlp(mlp: torch.nn.Module, joined: JoinedProjections, x: torch.Tensor) -> torch.Tensor:
    """The layer's MLP of `x`, through its joined gate and up projections where it has them."""
    if joined.gate_up is None:
        return mlp(x)
    gate, up = joined.gate_up(x).chunk(2, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)
