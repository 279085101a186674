"""The torch runtime: a transformers model and its `DynamicCache`, one eager forward a call.

Trees run as one forward with a 4D additive attention mask and explicit positions; a kept
path is compacted in place by gathering its keys and values to the front.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .base import ModelRuntime


def keeps_every_position(model: torch.nn.Module) -> bool:
    """Tree compaction moves cache entries by slot, which assumes slot = position: true for
    full attention, not for sliding-window layers (which drop old positions)."""
    config = model.config
    windowed = getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    return not windowed and all(kind == "full_attention" for kind in layer_types)


class TorchRuntime(ModelRuntime):
    name = "torch"

    def __init__(self, model: torch.nn.Module, device: torch.device, hidden_states: bool = False, feature_layers: tuple[int, ...] = ()):
        super().__init__(model.get_output_embeddings().weight.shape[0])
        self.model = model
        self.device = device
        self.returns_hidden = hidden_states
        self.feature_layers = tuple(feature_layers)
        self._hidden: torch.Tensor | None = None
        self._new_features: torch.Tensor | None = None
        self.supports_trees = keeps_every_position(model)
        self.cache = DynamicCache(config=model.config)

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        start = len(self)
        output = self._call(
            input_ids=torch.tensor([new_ids], device=self.device),  # (1, T)
            position_ids=torch.arange(start, start + len(new_ids), device=self.device)[None],  # (1, T)
            logits_to_keep=logits_wanted,
        )
        return output.logits[0].float()  # (logits_wanted, V)

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        allowed = self.visible_slots(parents)  # (T, past + T)
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        # Additive mask, (1, 1, T, past + T): 0 where allowed, the dtype's most negative
        # value elsewhere (not -inf, which turns a fully masked row into NaN).
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), torch.finfo(dtype).min)
        output = self._call(
            input_ids=torch.tensor([new_ids], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            attention_mask=mask[None, None],
            logits_to_keep=logits_wanted,
        )
        return output.logits[0].float()

    def _call(self, **inputs):
        with torch.inference_mode():
            output = self.model(
                **inputs, past_key_values=self.cache, use_cache=True, output_hidden_states=self.returns_hidden or bool(self.feature_layers)
            )
        if self.returns_hidden:
            # transformers' last entry is after the final norm: what the LM head reads.
            self._hidden = output.hidden_states[-1][0, -output.logits.shape[1]:].float()
        if self.feature_layers:
            # hidden_states[i] is what enters layer i (0: the embeddings), llama.cpp's "layer input" i.
            self._new_features = torch.cat([output.hidden_states[layer][0] for layer in self.feature_layers], dim=-1).float()
        return output

    def _last_features(self) -> torch.Tensor:
        return self._new_features

    def last_hidden_states(self) -> torch.Tensor:
        if self._hidden is None:
            return super().last_hidden_states()
        return self._hidden

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        moved = [(slot, prefix + offset) for offset, slot in enumerate(extra_slots) if slot != prefix + offset]
        if moved:
            source = torch.tensor([slot for slot, _ in moved], device=self.device)
            destination = torch.tensor([to for _, to in moved], device=self.device)
            with torch.inference_mode():  # the cache tensors are inference tensors
                for layer in self.cache.layers:
                    # The right-hand side is gathered before the write, so overlaps are safe.
                    layer.keys[..., destination, :] = layer.keys[..., source, :]
                    layer.values[..., destination, :] = layer.values[..., source, :]
        surplus = len(self) - (prefix + len(extra_slots))
        if surplus > 0:
            self.cache.crop(-surplus)  # transformers 5: a negative count of tokens to drop

    def _clear(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
