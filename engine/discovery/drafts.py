"""For a target found on disk: which found models can draft for it, which EAGLE-3 head fits
it, and which decoding methods the pair then gets.

A draft must share its target's tokenizer (engine/compat.py). Found models carry a digest of
their token list, so models with equal digests have equal token lists, which is exactly what
compat's check accepts; it is asked only to say where two tokenizers differ.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import methods
from ..compat import compatibility_reason
from .found import FoundHead, FoundModel, folder_tokens
from .scan import Found


@dataclass(frozen=True)
class DraftChoices:
    target: FoundModel
    drafts: tuple[FoundModel, ...]  # smaller found models with its tokenizer, smallest first
    heads: tuple[FoundHead, ...]  # EAGLE-3 heads for its hidden width and vocabulary
    other_tokenizers: int  # usable found models that cannot draft for it


@dataclass(frozen=True)
class PairAbilities:
    """What engine/methods.py asks of a pair, known before loading it."""

    has_draft_model: bool
    supports_trees: bool
    has_eagle_head: bool
    has_heads: bool = False  # calibrated heads come from calibrating the loaded pair


def by_tokenizer(models: tuple[FoundModel, ...] | list[FoundModel]) -> dict[str, list[FoundModel]]:
    """Usable models grouped by tokenizer: any model of a group can draft for a larger one."""
    groups: dict[str, list[FoundModel]] = {}
    for model in models:
        if model.usable and model.tokenizer is not None:
            groups.setdefault(model.tokenizer, []).append(model)
    return groups


def draft_choices(target: FoundModel, found: Found) -> DraftChoices:
    same_tokenizer = by_tokenizer(found.models).get(target.tokenizer or "", [])
    drafts = sorted(
        (model for model in same_tokenizer if model.source != target.source and _smaller(model, target)),
        key=lambda model: model.parameters or model.file_bytes,
    )
    others = [model for model in found.usable if model.tokenizer != target.tokenizer]
    heads = [head for head in found.heads if _head_fits(head, target)]
    return DraftChoices(target, tuple(drafts), tuple(heads), len(others))


def why_not(target: FoundModel, draft: FoundModel) -> str | None:
    """Why `draft` cannot draft for `target` (compat's sentence), or None when it can."""
    if target.tokenizer is not None and target.tokenizer == draft.tokenizer:
        return None
    return compatibility_reason(TokenList(folder_tokens(target.source)), TokenList(folder_tokens(draft.source)))


def pair_methods(target: FoundModel | None, draft: FoundModel | None, has_draft_model: bool, has_eagle_head: bool) -> tuple[str, ...]:
    """The methods a pair of these gets; `target` or `draft` is None where it was not found on
    disk (then its attention is taken to be full: most models' is)."""
    windowed = any(model is not None and model.sliding_window for model in (target, draft))
    abilities = PairAbilities(has_draft_model=has_draft_model, supports_trees=not windowed, has_eagle_head=has_eagle_head)
    return methods.offered_by(abilities)


class TokenList:
    """A token list in the shape compat.py reads a tokenizer: its length and its tokens by id."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokens[token_id] for token_id in ids]


def _smaller(draft: FoundModel, target: FoundModel) -> bool:
    """A draft pays only when it runs faster than its target: fewer parameters (or bytes)."""
    if draft.parameters and target.parameters:
        return draft.parameters < target.parameters
    return bool(draft.file_bytes and target.file_bytes) and draft.file_bytes < target.file_bytes


def _head_fits(head: FoundHead, target: FoundModel) -> bool:
    return (
        head.vocab_size is not None and head.vocab_size == target.vocab_size
        and head.target_hidden_size is not None and head.target_hidden_size == target.hidden_size
    )
