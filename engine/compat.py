"""Whether a draft model can draft for a target: they must share one tokenizer.

Speculative decoding hands token ids from the draft to the target unchanged, so both must
mean the same text by every id. Which special tokens each tokenizer *labels* bos or eos does
not matter: a reply stops at the target's own stop tokens, and the draft's labels never
reach the output. (One transformers version's GGUF converter labelled the demo target's
`<|im_start|>` as eos, and pairs with a correctly labelled draft were refused for it.)
"""
from __future__ import annotations

from typing import Any

from .errors import IncompatiblePairError

def check_pair_compatible(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise IncompatiblePairError, saying where they differ, unless the tokenizers match."""
    reason = compatibility_reason(target_tokenizer, draft_tokenizer)
    if reason is not None:
        raise IncompatiblePairError(reason)


def compatibility_reason(target_tokenizer: Any, draft_tokenizer: Any) -> str | None:
    """Why the draft cannot draft for the target, or None when it can."""
    if target_tokenizer is draft_tokenizer:
        return None
    return (
        _size_difference(target_tokenizer, draft_tokenizer)
        or _token_difference(target_tokenizer, draft_tokenizer)
    )


def _size_difference(target_tokenizer: Any, draft_tokenizer: Any) -> str | None:
    target_size, draft_size = len(target_tokenizer), len(draft_tokenizer)
    if target_size == draft_size:
        return None
    return (
        f"Draft and target vocabularies differ in size: the target has {target_size} tokens, "
        f"the draft {draft_size}. A draft must use its target's tokenizer."
    )


def _token_difference(target_tokenizer: Any, draft_tokenizer: Any) -> str | None:
    # The sizes are equal by now. One batched call per tokenizer: ~25 ms for 49k tokens.
    ids = list(range(len(target_tokenizer)))
    target_tokens = target_tokenizer.convert_ids_to_tokens(ids)
    draft_tokens = draft_tokenizer.convert_ids_to_tokens(ids)
    if target_tokens == draft_tokens:
        return None
    token_id = next(i for i, (ours, theirs) in enumerate(zip(target_tokens, draft_tokens)) if ours != theirs)
    return (
        f"Draft and target tokenizers differ at token id {token_id}: target has "
        f"{target_tokens[token_id]!r}, draft has {draft_tokens[token_id]!r}. "
        "A draft must use its target's tokenizer."
    )
