"""Turn a growing list of token ids into text deltas.

Decoding token by token breaks multi-byte characters and tokenizers that merge spaces
across tokens, so each step decodes a short window that ends at the new tokens and emits
only what that window adds, holding back text that ends in an incomplete character.
"""
from __future__ import annotations

INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._window_start = 0  # first token of the window that is decoded again
        self._emitted_up_to = 0  # tokens whose text is already in self.text

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
