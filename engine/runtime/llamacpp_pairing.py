"""Whether llama.cpp's speculative decoding accepts a draft GGUF for a target, asked of
llama.cpp itself: both vocabularies as its loader reads them (llama-cpp-python's C API),
judged by the rules of `common_speculative_are_compatible` in llama.cpp's
`common/speculative.cpp`, which `llama-server -md` and LM Studio go through.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import llamacpp_library

# llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE and SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5


def speculation_refusals(target: Path, draft: Path) -> list[str]:
    """Why llama.cpp would refuse `draft` as the draft of `target`: empty when it accepts it.
    Needs llama-cpp-python (ImportError otherwise)."""
    if not llamacpp_library.available():
        raise ImportError("llama-cpp-python is not installed")
    llama_cpp = llamacpp_library.library()  # its log goes to Tandem's debug log, not the terminal
    with _vocabulary(llama_cpp, target) as target_vocab, _vocabulary(llama_cpp, draft) as draft_vocab:
        return _refusals(llama_cpp, target_vocab, draft_vocab)


def _refusals(api: Any, target: Any, draft: Any) -> list[str]:
    """The checks in llama.cpp's order; like llama.cpp, stop at the first that fails."""
    if api.llama_vocab_type(target) != api.llama_vocab_type(draft):
        return [f"vocabulary type {api.llama_vocab_type(draft)} in the draft, {api.llama_vocab_type(target)} in the target"]
    for marker, adds, token in (("BOS", api.llama_vocab_get_add_bos, api.llama_vocab_bos),
                                ("EOS", api.llama_vocab_get_add_eos, api.llama_vocab_eos)):
        if adds(target) != adds(draft) or (adds(target) and token(target) != token(draft)):
            return [
                f"{marker} differs: added {adds(draft)}, id {token(draft)} in the draft; "
                f"added {adds(target)}, id {token(target)} in the target"
            ]
    target_size, draft_size = api.llama_vocab_n_tokens(target), api.llama_vocab_n_tokens(draft)
    if abs(target_size - draft_size) > MAX_SIZE_DIFFERENCE:
        return [f"{draft_size} tokens in the draft, {target_size} in the target (at most {MAX_SIZE_DIFFERENCE} apart)"]
    for token_id in range(FIRST_COMPARED_TOKEN, min(target_size, draft_size)):
        draft_text, target_text = api.llama_vocab_get_text(draft, token_id), api.llama_vocab_get_text(target, token_id)
        if draft_text != target_text:  # bytes, as llama.cpp compares them
            return [f"token {token_id} is {draft_text.decode(errors='replace')!r} in the draft, "
                    f"{target_text.decode(errors='replace')!r} in the target"]
    return []


@contextmanager
def _vocabulary(api: Any, path: Path) -> Iterator[Any]:
    params = api.llama_model_default_params()
    params.vocab_only = True  # the weights play no part in the check
    model = api.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError(f"llama.cpp could not load {path}")
    try:
        yield api.llama_model_get_vocab(model)
    finally:
        api.llama_model_free(model)
