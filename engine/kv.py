"""A model together with its KV cache and the token ids that cache holds.

Rolling back a rejected draft is a crop of the cache to a shorter prefix; starting a new
turn, regenerating, or editing a message reuses whatever prefix the cache already shares
with the new context. Nothing is ever stashed on the model object itself.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


class CachedModel:
    """Runs a causal LM incrementally over a growing (and sometimes shrinking) token list."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = DynamicCache(config=model.config)
        self.cached_ids: list[int] = []
        self.forward_calls = 0

    def __len__(self) -> int:
        return len(self.cached_ids)

    def crop(self, length: int) -> None:
        """Forget every cached position from `length` on."""
        surplus = len(self.cached_ids) - length
        if surplus > 0:
            self.cache.crop(-surplus)  # transformers 5: a negative count of tokens to drop
            del self.cached_ids[length:]

    def pending(self, context: list[int]) -> list[int]:
        """Crop the cache to the longest prefix it shares with `context` and return the ids
        of `context` it still lacks. At least the last id is always left pending, since its
        logits are what the caller needs next."""
        shared = 0
        limit = min(len(self.cached_ids), len(context) - 1)
        while shared < limit and self.cached_ids[shared] == context[shared]:
            shared += 1
        self.crop(shared)
        return context[shared:]

    def forward(self, new_ids: list[int], logits_wanted: int = 1) -> torch.Tensor:
        """Append `new_ids` to the cache; return float32 logits (logits_wanted, V) for the
        last `logits_wanted` of them (the LM head over a whole prompt is costly to skip)."""
        start = len(self.cached_ids)
        input_ids = torch.tensor([new_ids], device=self.device)  # (1, T)
        position_ids = torch.arange(start, start + len(new_ids), device=self.device)[None]  # (1, T)
        with torch.inference_mode():
            output = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_wanted,
            )
        self.cached_ids.extend(new_ids)
        self.forward_calls += 1
        return output.logits[0].float()  # (logits_wanted, V)

    def logits_for(self, context: list[int], extra: list[int] = ()) -> torch.Tensor:
        """Logits after the last token of `context` and after each of `extra`:
        (1 + len(extra), V), in one forward over whatever the cache lacks."""
        new_ids = self.pending(context) + list(extra)
        return self.forward(new_ids, logits_wanted=1 + len(extra))

    def reset(self) -> None:
        self.crop(0)
