from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

from engine.compat import check_pair_compatible, compatibility_reason
from engine.errors import IncompatiblePairError

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


def test_same_vocabulary_is_compatible(make_word_tokenizer):
    target, draft = make_word_tokenizer(WORDS), make_word_tokenizer(WORDS)

    check_pair_compatible(target, draft)
    assert compatibility_reason(target, draft) is None


def test_a_renamed_token_is_named_with_its_id(make_word_tokenizer):
    renamed = WORDS.copy()
    renamed[2] = "GAMMA"  # id 4 + 2: ids 0-3 are the special tokens

    with pytest.raises(IncompatiblePairError) as caught:
        check_pair_compatible(make_word_tokenizer(WORDS), make_word_tokenizer(renamed))

    assert str(caught.value) == (
        "Draft and target tokenizers differ at token id 6: target has 'gamma', draft has 'GAMMA'. "
        "A draft must use its target's tokenizer."
    )


@pytest.mark.parametrize("draft_words", [WORDS[:-1], [*WORDS, "zeta"]])
def test_a_different_vocabulary_size_is_refused(make_word_tokenizer, draft_words):
    reason = compatibility_reason(make_word_tokenizer(WORDS), make_word_tokenizer(draft_words))

    assert reason is not None
    assert f"the target has {len(WORDS) + 4} tokens, the draft {len(draft_words) + 4}" in reason


def test_a_differently_labelled_eos_is_compatible(make_word_tokenizer):
    # Same vocabulary, another token labelled eos (as one GGUF converter did to the demo
    # target): the reply stops at the target's stop tokens, so the pair works.
    target = make_word_tokenizer(WORDS)
    draft = make_word_tokenizer(WORDS, eos_token="<pad>")

    assert compatibility_reason(target, draft) is None


def test_demo_tokenizer_is_compatible_with_itself_quickly(demo_target_folder):
    target = AutoTokenizer.from_pretrained(demo_target_folder)
    draft = AutoTokenizer.from_pretrained(demo_target_folder)

    started = time.perf_counter()
    reason = compatibility_reason(target, draft)
    elapsed = time.perf_counter() - started

    assert reason is None
    assert elapsed < 1.0, f"comparing 49k tokens took {elapsed:.2f} s"


def test_demo_and_word_tokenizers_are_incompatible(demo_target_folder, make_word_tokenizer):
    reason = compatibility_reason(AutoTokenizer.from_pretrained(demo_target_folder), make_word_tokenizer(WORDS))

    assert reason is not None and "49152" in reason
