"""A small causal LM as drafter: up to K autoregressive steps over its own persistent KV
cache, optionally cut short by a stop rule (SpecDec++'s adaptive length, SPRINTER's gate)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..runtime import ModelRuntime
from ..sampling import Sampler, best_token
from .base import ChainDrafter, Proposal, RoundOutcome
from .chain_length import ChainLength


class StopRule(Protocol):
    """Told about each drafted token, says whether to stop drafting after it. `unchecked`
    counts the leading tokens it lets out without the target checking them (SPRINTER;
    exact rules leave it 0)."""

    unchecked: int

    def stop_after(self, token: int, probs: torch.Tensor, draft: ModelRuntime) -> bool: ...


class ModelDrafter(ChainDrafter):
    name = "draft model"

    def __init__(
        self, draft: ModelRuntime, target_vocab_size: int, draft_tokens: int,
        stop_rule: Callable[[Sampler], StopRule] | None = None, length: ChainLength | None = None,
    ):
        """`length`: where given, each chain is as long as it says pays here (chain_length.py),
        at most `draft_tokens`; else always `draft_tokens` long."""
        super().__init__(draft_tokens)
        self.length = length
        self.draft = draft
        # Embedding tables are often padded past the tokenizer; verification works on the
        # target's vocabulary, so draft logits are cut or padded to its width.
        self.vocab_size = target_vocab_size
        self.stop_rule = stop_rule  # made fresh for every proposal: (sampler) -> StopRule

    @property
    def runtimes(self) -> tuple[ModelRuntime, ...]:
        return (self.draft,)

    def propose_chain(self, context: list[int], max_tokens: int, sampler: Sampler) -> Proposal:
        if not self.draft.ready_for(context):  # an EAGLE-3 head before the target has read the prompt
            return Proposal.chain(context, [])
        if self.length is not None:
            max_tokens = min(max_tokens, self.length.choose())
        calls_before = self.draft.forward_calls
        stop = self.stop_rule(sampler) if self.stop_rule is not None else None
        logits = fit_vocab(self.draft.logits_for(context)[-1], self.vocab_size)  # (V,)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(max_tokens):
            # A greedy draft without a stop rule needs no distribution: skip the softmax.
            probs = draft_distribution(logits, sampler) if stop is not None or not sampler.greedy else None
            token = best_token(logits) if sampler.greedy else sampler.draw(probs)
            if not sampler.greedy:
                rows.append(probs)
            tokens.append(token)
            if stop is not None and stop.stop_after(token, probs, self.draft):
                break
            if step + 1 < max_tokens:  # the last token's logits are the target's business
                logits = fit_vocab(self.draft.forward([token])[-1], self.vocab_size)
        return Proposal.chain(
            context, tokens, torch.stack(rows) if rows else None,
            draft_calls=self.draft.forward_calls - calls_before, unchecked=stop.unchecked if stop is not None else 0,
        )

    def observe(self, outcome: RoundOutcome) -> None:
        if self.length is not None and outcome.target_called and outcome.proposed:
            self.length.record(outcome.proposed, outcome.accepted, outcome.draft_calls, outcome.draft_s,
                               outcome.target_tokens, outcome.target_s)

    def reset(self) -> None:
        self.draft.reset()


def draft_distribution(logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """(V,) logits -> the distribution the draft draws from; when greedy (a point mass on the
    argmax is what is proposed) its plain softmax, which is what learned heads read."""
    return torch.softmax(logits.float(), dim=-1) if sampler.greedy else sampler.probabilities(logits[None])[0]


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits (..., V') cut or padded with -inf to the target's vocabulary V."""
    width = logits.shape[-1]
    if width > vocab_size:
        return logits[..., :vocab_size]
    if width < vocab_size:
        return torch.nn.functional.pad(logits, (0, vocab_size - width), value=float("-inf"))
    return logits
