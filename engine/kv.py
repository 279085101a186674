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

    def catch_up(self, context: list[int]) -> None:
        """Cache all of `context` but its last token (whose logits a round still needs), so
        that the round that follows costs what a round costs, whatever the cache missed."""
        pending = self.pending(context)
        if len(pending) > 1:
            self.forward(pending[:-1])

    def forward(self, new_ids: list[int], logits_wanted: int = 1) -> torch.Tensor:
        """Append `new_ids` to the cache; return float32 logits (logits_wanted, V) for the
        last `logits_wanted` of them (the LM head over a whole prompt is costly to skip)."""
        start = len(self.cached_ids)
        input_ids = torch.tensor([new_ids], device=self.device)  # (1, T)
        position_ids = torch.arange(start, start + len(new_ids), device=self.device)[None]  # (1, T)
        output = self._run(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_wanted,
        )
        self.cached_ids.extend(new_ids)
        self.forward_calls += 1
        return output.logits[0].float()  # (logits_wanted, V)

    def forward_masked(
        self, new_ids: list[int], position_ids: list[int], allowed: torch.Tensor, logits_wanted: int
    ) -> torch.Tensor:
        """Append `new_ids` with explicit positions and attention pattern: `allowed` (T, len + T)
        says which cached slots and which new tokens each new token may see. This is how a
        token tree is run in one forward. Returns float32 logits for the last `logits_wanted`."""
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        # Additive mask, (1, 1, T, len + T): 0 where allowed, the dtype's most negative
        # value elsewhere (not -inf, which turns a fully masked row into NaN).
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), torch.finfo(dtype).min)
        output = self._run(
            input_ids=torch.tensor([new_ids], device=self.device),
            position_ids=torch.tensor([position_ids], device=self.device),
            attention_mask=mask[None, None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_wanted,
        )
        self.cached_ids.extend(new_ids)
        self.forward_calls += 1
        return output.logits[0].float()

    def _run(self, **inputs):
        try:
            with torch.inference_mode():
                return self.model(**inputs)
        except BaseException:
            # A forward that failed midway (out of memory, say) may have grown some layers'
            # caches and not others: start from scratch rather than trust any of it.
            self.reset()
            raise

    def keep_slots(self, prefix: int, extra_slots: list[int]) -> None:
        """Compact the cache in place to its first `prefix` slots followed by `extra_slots`
        (ascending, all >= prefix): a verified tree path keeps its keys and values, the
        rejected branches are dropped, and nothing is recomputed."""
        if any(slot < prefix for slot in extra_slots) or extra_slots != sorted(extra_slots):
            raise ValueError("extra slots must be ascending and lie past the prefix")
        moved = [(slot, prefix + offset) for offset, slot in enumerate(extra_slots) if slot != prefix + offset]
        if moved:
            source = torch.tensor([slot for slot, _ in moved], device=self.device)
            destination = torch.tensor([to for _, to in moved], device=self.device)
            with torch.inference_mode():  # the cache tensors are inference tensors
                for layer in self.cache.layers:
                    # The right-hand side is gathered before the write, so overlaps are safe.
                    layer.keys[..., destination, :] = layer.keys[..., source, :]
                    layer.values[..., destination, :] = layer.values[..., source, :]
            for slot, to in moved:
                self.cached_ids[to] = self.cached_ids[slot]
        self.crop(prefix + len(extra_slots))

    def logits_for(self, context: list[int], extra: list[int] = ()) -> torch.Tensor:
        """Logits after the last token of `context` and after each of `extra`:
        (1 + len(extra), V), in one forward over whatever the cache lacks."""
        new_ids = self.pending(context) + list(extra)
        return self.forward(new_ids, logits_wanted=1 + len(extra))

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids = []
