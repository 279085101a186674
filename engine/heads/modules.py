"""The two heads. Both take `head_features` and return one logit per token: the log-odds
that the target would accept it. Inputs are standardised with the training set's mean and
spread, stored with the weights, so hidden states of any scale train alike."""
from __future__ import annotations

import torch
from torch import nn


class Standardise(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("scale", torch.ones(width))

    def fit(self, features: torch.Tensor) -> None:
        self.mean.copy_(features.mean(0))
        self.scale.copy_(features.std(0).clamp_min(1e-4))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.mean) / self.scale


class SprinterVerifier(nn.Module):
    """SPRINTER's verifier: one linear layer (the paper's) on the standardised features;
    sigmoid of its output is P(the target accepts)."""

    def __init__(self, width: int):
        super().__init__()
        self.standardise = Standardise(width)
        self.linear = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(self.standardise(features))[..., 0]


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    """SpecDec++'s acceptance head: residual blocks x + SiLU(Linear(x)) then one logit (the
    paper's best: 3 blocks). The paper's blocks are as wide as the draft; here the features
    are first projected to `inner` wide, so that training on a CPU takes seconds, not an hour
    (3 blocks of 579 x 579 over 20k examples cost ~150 GFLOP a step)."""

    def __init__(self, width: int, blocks: int = 3, inner: int = 128):
        super().__init__()
        self.standardise = Standardise(width)
        self.project = nn.Linear(width, inner)
        self.blocks = nn.Sequential(*(ResidualBlock(inner) for _ in range(blocks)))
        self.logit = nn.Linear(inner, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.logit(self.blocks(self.project(self.standardise(features))))[..., 0]
