"""From logits to the distributions tokens are drawn from.

Speculative sampling is exact only if verification compares the very distributions the
tokens were sampled from, so the target and every drafter go through this one function.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """Temperature, top-k and top-p, plus the random generator every draw uses."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """(N, V) logits -> (N, V) float32 probabilities after temperature, top-k, top-p."""
        scores = logits.float() / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth_best = torch.topk(scores, self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth_best, float("-inf"))
        if self.top_p < 1.0:
            scores = _keep_top_p(scores, self.top_p)
        return torch.softmax(scores, dim=-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token from (V,) non-negative weights (they need not sum to 1): the first token
        whose running total passes a uniform draw times the total. torch.multinomial took
        1.2 ms for one draw over the demo's 49,152 tokens, a third of its 3.4 ms step on the
        CPU; this takes ~0.07 ms. A token of weight 0 is never drawn."""
        # On the CPU, where the generator lives, whatever device the distribution came from.
        weights = probs.detach().cpu().double()
        running = torch.cumsum(weights, dim=0)
        total = float(running[-1])
        if not (0 < total < math.inf) or bool((weights < 0).any()):
            raise ValueError("cannot draw a token: the distribution has a negative, infinite or NaN weight, or none above 0")
        point = torch.tensor([self.uniform() * total], dtype=torch.float64)
        token = int(torch.searchsorted(running, point, right=True))
        if token >= len(weights):  # the draw rounded up to the total: the last token with weight
            token = int(torch.nonzero(weights)[-1])
        return token

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from (V,) logits: argmax when greedy, else a draw."""
        if self.greedy:
            return best_token(logits)
        return self.draw(self.probabilities(logits[None])[0])


def draw_each_row(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of (B, V) non-negative weights, row b with its own CPU generator b,
    on the weights' device: `Sampler.draw`'s rule (the first token whose running total passes
    a uniform draw times the total) for every row at once. Only the B uniforms cross from the
    host; copying a GPU batch's weights to the host and drawing row by row there (384 rows
    of the demo's 49,152 tokens) bounded distillation's reply writing on an H100 at ~400
    tokens/s (docs/BENCHMARKS.md). A token of weight 0 is never drawn: a uniform below 1
    times the total stays below the total, so the draw lands on a token that adds weight."""
    running = torch.cumsum(probs.detach(), dim=-1, dtype=torch.float64)  # (B, V)
    totals = running[:, -1]
    broken = ~torch.isfinite(totals) | (totals <= 0) | (probs < 0).any(dim=-1)
    if bool(broken.any()):
        raise ValueError("cannot draw a token: a row has a negative, infinite or NaN weight, or none above 0")
    uniforms = [float(torch.rand((), generator=generator, dtype=torch.float64)) for generator in generators]
    points = torch.tensor(uniforms, dtype=torch.float64, device=probs.device) * totals  # (B,)
    return torch.searchsorted(running, points[:, None], right=True)[:, 0]


def best_tokens(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of (n, V) logits: the first on a tie, a NaN counted the largest,
    as torch.argmax gives it. float32 CPU logits go through numpy: torch.argmax took ~87 µs
    over the demo's 49,152 logits, numpy ~4 µs, and a greedy round takes one for the target's
    rows and one per drafted token, against a 3.4 ms step of the demo target."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


def best_token(logits: torch.Tensor) -> int:
    """best_tokens of one (V,) row."""
    return best_tokens(logits[None])[0]


def _keep_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask all but the smallest set of best tokens whose probability reaches top_p.

    The best tokens are found by topk of a growing k rather than by sorting the vocabulary:
    a descending sort of the demo's 49,152 scores took 3.7 ms, four times topk's and more than
    the target's step, for every sampled token and every node of a verified tree. A language
    model's nucleus is mostly a few dozen tokens; a flat one takes the wider searches."""
    width = scores.shape[-1]
    normaliser = torch.logsumexp(scores, dim=-1, keepdim=True)
    for k in (64, 1024, width):
        best_scores, best_ids = torch.topk(scores, min(k, width), dim=-1)  # best first
        best_probs = torch.exp(best_scores - normaliser)
        # A token stays while the better tokens before it have not yet reached top_p; the best always stays.
        keep_best = (best_probs.cumsum(dim=-1) - best_probs) < top_p
        if k >= width or not bool(keep_best[..., -1].any()):  # every row's nucleus ends within these k
            keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best_ids, keep_best)
            return scores.masked_fill(~keep, float("-inf"))
    raise AssertionError("unreachable: the last k is the whole vocabulary")


def one_hot_rows(tokens: list[int], vocab_size: int) -> torch.Tensor:
    """(K, V) point masses: the distributions of a drafter that proposes deterministically."""
    rows = torch.zeros(len(tokens), vocab_size)
    if tokens:
        rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return rows
