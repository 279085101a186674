"""Turn a growing list of token ids into text deltas.

Decoding token by token breaks multi-byte characters and tokenizers that merge spaces
across tokens, so each step decodes a short window that ends at the new tokens and emits
only what that window adds, holding back text that ends in an incomplete character.
"""
from __future__ import annotations

from collections.abc import Sequence

INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context_ids: Sequence[int] = ()):
        """`context_ids`: tokens the new text follows (the end of a reply being continued),
        decoded with the first new ones so that the space between them is kept, never emitted."""
        self.tokenizer = tokenizer
        self.token_ids: list[int] = list(context_ids)
        self.text = ""
        self._window_start = 0  # first token of the window that is decoded again
        self._emitted_up_to = len(self.token_ids)  # tokens whose text is already in self.text (or context)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the text they complete (possibly empty)."""
        self.token_ids.extend(new_ids)
        before = self._decode(self._window_start, self._emitted_up_to)
        after = self._decode(self._window_start, len(self.token_ids))
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return ""
        delta = after[len(before) :]
        self.text += delta
        self._window_start = self._emitted_up_to
        self._emitted_up_to = len(self.token_ids)
        return delta

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)


def text_after(tokenizer, context_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text of `new_ids` as it reads after `context_ids`: a word-level tokenizer puts the
    space between two tokens only when it decodes them together."""
    context = tokenizer.decode(list(context_ids), skip_special_tokens=True)
    whole = tokenizer.decode([*context_ids, *new_ids], skip_special_tokens=True)
    # A tokenizer that tidies spaces (" ." to ".") can change the context's own end once
    # more follows it: the new text starts where the two decodings part.
    shared = next((index for index, (a, b) in enumerate(zip(context, whole)) if a != b), min(len(context), len(whole)))
    return whole[shared:]
