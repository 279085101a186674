"""Which tokens a reduced-vocabulary draft keeps (see `runtime/reduced_vocabulary.py`): the
ones the target writes most often in its replies, plus every special token and every
single-byte token, which a GGUF file of the draft needs for llama.cpp to load it."""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ...runtime.reduced_vocabulary import ReducedVocabulary
from .data import Sequence


def choose_vocabulary(sequences: list[Sequence], size: int, tokenizer: Any, full_size: int) -> ReducedVocabulary:
    """The `size` tokens (at least the required ones) the target writes most in `sequences`,
    counting both its sampled tokens and its first choices."""
    required = _required_ids(tokenizer)
    counts: Counter[int] = Counter()
    for sequence in sequences:
        counts.update(sequence.token_ids[sequence.prompt_length :].tolist())
        counts.update(sequence.top_ids[:, 0].tolist())
    kept = set(required)
    for token, _ in counts.most_common():
        if len(kept) >= size:
            break
        kept.add(token)
    return ReducedVocabulary(tuple(sorted(token for token in kept if token < full_size)), full_size)


def coverage(sequences: list[Sequence], vocabulary: ReducedVocabulary) -> dict[str, float]:
    """Shares of the target's sampled tokens and first choices that the draft can propose."""
    table = vocabulary.kept_mask()
    sampled = torch.cat([sequence.token_ids[sequence.prompt_length :].long() for sequence in sequences])
    first = torch.cat([sequence.top_ids[:, 0].long() for sequence in sequences])
    return {"sampled": float(table[sampled].float().mean()), "first_choice": float(table[first].float().mean())}


def in_model_ids(sequences: list[Sequence], vocabulary: ReducedVocabulary) -> list[Sequence]:
    """The same sequences as the reduced model reads and predicts them."""
    return [
        Sequence(
            key=sequence.key,
            token_ids=vocabulary.to_model_ids(sequence.token_ids),
            prompt_length=sequence.prompt_length,
            top_ids=vocabulary.to_model_ids(sequence.top_ids),
            top_logprobs=sequence.top_logprobs,
        )
        for sequence in sequences
    ]


def _required_ids(tokenizer: Any) -> set[int]:
    vocab = tokenizer.get_vocab()
    required = {int(token_id) for token_id in getattr(tokenizer, "all_special_ids", [])}
    required |= {int(token_id) for token_id in getattr(tokenizer, "added_tokens_decoder", {})}
    required |= {vocab[char] for char in _byte_characters() if char in vocab}
    return required


def _byte_characters() -> list[str]:
    """The 256 characters byte-level BPE writes bytes as (GPT-2's table): printable Latin-1
    bytes stand for themselves, the others for code points from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = [], 0
    for byte in range(256):
        if byte in printable:
            characters.append(chr(byte))
        else:
            characters.append(chr(256 + extra))
            extra += 1
    return characters
