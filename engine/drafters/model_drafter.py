"""A small causal LM as drafter: K autoregressive steps over its own persistent KV cache."""
from __future__ import annotations

import torch

from ..runtime import ModelRuntime
from ..sampling import Sampler
from .base import DraftProposal, Drafter


class ModelDrafter(Drafter):
    name = "draft model"

    def __init__(self, draft: ModelRuntime, target_vocab_size: int):
        self.draft = draft
        # Embedding tables are often padded past the tokenizer; verification works on the
        # target's vocabulary, so draft logits are cut or padded to its width.
        self.vocab_size = target_vocab_size

    def propose(self, context: list[int], max_tokens: int, sampler: Sampler) -> DraftProposal:
        calls_before = self.draft.forward_calls
        logits = self._fit_vocab(self.draft.logits_for(context)[-1])  # (V,)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(max_tokens):
            if sampler.greedy:
                token = int(torch.argmax(logits))
            else:
                probs = sampler.probabilities(logits[None])[0]
                token = sampler.draw(probs)
                rows.append(probs)
            tokens.append(token)
            if step + 1 < max_tokens:  # the last token's logits are the target's business
                logits = self._fit_vocab(self.draft.forward([token])[-1])
        probs = torch.stack(rows) if rows else None
        return DraftProposal(tokens, probs, self.draft.forward_calls - calls_before)

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[..., : self.vocab_size]
        if width < self.vocab_size:
            return torch.nn.functional.pad(logits, (0, self.vocab_size - width), value=float("-inf"))
        return logits

    def reset(self) -> None:
        self.draft.reset()
