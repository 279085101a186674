"""A draft that knows only part of its tokenizer's vocabulary, behind the full-vocabulary
contract.

A narrow draft's output layer (vocabulary × width) is most of its weights and of the cost of
every call: 12.6M of the first demo draft's 16.4M parameters. Most of those 49,152 rows are
tokens the target almost never writes in a reply. A reduced draft keeps the target's most
frequent tokens (FR-Spec, EAGLE-3) plus one shared id for every other token, on both sides:
a rare token in the context is read as "some other token", and the draft never proposes one.

Decoding stays exact: a verifier accepts or rejects whatever the draft proposes, and a token
the draft cannot propose is simply one it gives probability 0, which the residual
distribution covers. `ReducedVocabularyRuntime` maps ids into the model's vocabulary and
its logits back out (−inf outside), so the algorithms never learn that the draft is reduced.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from .base import ModelRuntime
from .wrapped import WrappedRuntime

VOCABULARY_FILE = "draft-vocabulary.json"


@dataclass(frozen=True)
class ReducedVocabulary:
    """Model id i is tokenizer id `kept_ids[i]`; every other tokenizer id is model id
    `other_id` (= len(kept_ids)), the model's last row."""

    kept_ids: tuple[int, ...]
    full_size: int  # the tokenizer's (and the target's) vocabulary
    _to_model: np.ndarray = field(init=False, repr=False, compare=False)
    _kept_index: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.kept_ids)) != len(self.kept_ids) or not all(0 <= token < self.full_size for token in self.kept_ids):
            raise ValueError("kept ids must be distinct ids of the full vocabulary")
        table = np.full(self.full_size, len(self.kept_ids), dtype=np.int64)
        table[list(self.kept_ids)] = np.arange(len(self.kept_ids))
        object.__setattr__(self, "_to_model", table)
        # built once: `full_logits` runs on every draft call
        object.__setattr__(self, "_kept_index", torch.tensor(self.kept_ids, dtype=torch.long))

    @property
    def other_id(self) -> int:
        return len(self.kept_ids)

    @property
    def size(self) -> int:
        """Rows of the model's embedding and output layer."""
        return len(self.kept_ids) + 1

    def kept_mask(self) -> torch.Tensor:
        """(full_size,) bool: which tokenizer ids the draft keeps."""
        mask = torch.zeros(self.full_size, dtype=torch.bool)
        mask[self._kept_index] = True
        return mask

    def to_model_ids(self, ids: list[int] | torch.Tensor) -> list[int] | torch.Tensor:
        if isinstance(ids, torch.Tensor):
            return torch.from_numpy(self._to_model).to(ids.device)[ids.long()].to(ids.dtype)
        return self._to_model[np.asarray(ids, dtype=np.int64)].tolist()

    def full_logits(self, model_logits: torch.Tensor) -> torch.Tensor:
        """(n, size) model logits -> (n, full_size): the kept tokens' logits, −inf elsewhere
        (the shared "other" row is never proposed)."""
        full = torch.full((*model_logits.shape[:-1], self.full_size), float("-inf"), dtype=model_logits.dtype, device=model_logits.device)
        full[..., self._kept_index.to(model_logits.device)] = model_logits[..., : self.other_id]
        return full

    def save(self, folder: Path) -> None:
        text = json.dumps({"full_size": self.full_size, "kept_ids": list(self.kept_ids)})
        (folder / VOCABULARY_FILE).write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, folder: Path | None) -> ReducedVocabulary | None:
        """The reduced vocabulary a model folder declares, or None when it has the full one."""
        path = folder / VOCABULARY_FILE if folder is not None else None
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(tuple(int(token) for token in data["kept_ids"]), int(data["full_size"]))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ModelLoadError(f"Cannot read the draft's vocabulary {path}: {error}") from error


def full_vocabulary_view(model: torch.nn.Module, vocabulary: ReducedVocabulary) -> torch.nn.Module:
    """`model` (a transformers causal LM in `vocabulary`'s ids) as one that takes and gives
    the full vocabulary, for code that drives a model itself, such as transformers' assisted
    generation, which needs its assistant on the target's vocabulary. The view shares the
    model's weights; its logits are −inf outside the kept tokens, as with the runtime below."""

    class FullVocabulary(type(model)):  # type: ignore[misc, valid-type]
        def forward(self, input_ids=None, **kwargs):
            if input_ids is not None:
                input_ids = vocabulary.to_model_ids(input_ids)
            output = super().forward(input_ids=input_ids, **kwargs)
            output.logits = vocabulary.full_logits(output.logits)
            return output

    view = copy.copy(model)  # a new object over the same submodules and parameters
    view.__class__ = FullVocabulary
    view.config = copy.deepcopy(model.config)
    view.config.vocab_size = vocabulary.full_size
    return view


class ReducedVocabularyRuntime(WrappedRuntime):
    """`inner` runs the model in its own ids; this runtime speaks the full vocabulary. The two
    caches hold the same slots in the same order, so every slot operation passes straight on."""

    def __init__(self, inner: ModelRuntime, vocabulary: ReducedVocabulary):
        super().__init__(inner, vocabulary.full_size)
        self.vocabulary = vocabulary

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        return self.vocabulary.full_logits(self.inner.forward(self.vocabulary.to_model_ids(new_ids), logits_wanted))

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        model_ids = self.vocabulary.to_model_ids(new_ids)
        return self.vocabulary.full_logits(self.inner.forward_tree(model_ids, parents, logits_wanted))

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        self.inner.keep_slots(prefix, extra_slots)
