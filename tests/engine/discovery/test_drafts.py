"""For a found target: the drafts with its tokenizer, an EAGLE-3 head that fits it, n-gram
lookup always, and the methods the pair gets."""
from __future__ import annotations

from engine.discovery import by_tokenizer, discover, draft_choices, pair_methods, why_not
from tests.engine.discovery.fake_machine import LLAMA_TOKENS, OTHER_TOKENS, eagle3_head, furnished_home, write_gguf


def test_found_models_are_grouped_by_tokenizer(tmp_path):
    furnished_home(tmp_path)
    found = discover(home=tmp_path, environ={})
    groups = sorted(sorted(model.name for model in group) for group in by_tokenizer(found.models).values())
    assert groups == [
        ["llama-small:1b", "llama-tiny.Q8_0", "lmstudio-community/Llama-Big-GGUF/Llama-Big-Q4_K_M", "org/llama-mini"],
        ["other-7b"],
    ]  # the dangling "gone:latest" is in no group: it cannot draft


def test_a_target_is_offered_its_smaller_drafts_with_its_tokenizer_smallest_first_and_its_eagle_head(tmp_path):
    paths = furnished_home(tmp_path)
    found = discover(home=tmp_path, environ={})
    choices = draft_choices(found.model(str(paths["target"])), found)
    assert [draft.name for draft in choices.drafts] == ["org/llama-mini", "llama-tiny.Q8_0", "llama-small:1b"]
    assert [head.name for head in choices.heads] == ["someone/EAGLE3-Llama-Big"]
    assert choices.other_tokenizers == 1  # the qwen2 model in Jan's folder

    middle = draft_choices(found.model(str(paths["ollama draft"])), found)
    assert [draft.name for draft in middle.drafts] == ["org/llama-mini", "llama-tiny.Q8_0"]  # never a larger model
    assert middle.heads == ()  # the head was trained for a 64-wide target, this one is 16 wide


def test_why_a_model_cannot_draft_is_compats_sentence(tmp_path):
    paths = furnished_home(tmp_path)
    same_size_other_tokens = write_gguf(tmp_path / "my/other.gguf", tokens=[*LLAMA_TOKENS[:-1], "▁different"])
    found = discover([tmp_path / "my"], home=tmp_path, environ={})
    target = found.model(str(paths["target"]))
    assert why_not(target, found.model(str(paths["gpt4all draft"]))) is None
    assert why_not(target, found.model(str(paths["jan other"]))).startswith(
        f"Draft and target vocabularies differ in size: the target has {len(LLAMA_TOKENS)} tokens, the draft {len(OTHER_TOKENS)}."
    )
    assert why_not(target, found.model(str(same_size_other_tokens))) == (
        "Draft and target tokenizers differ at token id 63: target has '▁w60', draft has '▁different'. "
        "A draft must use its target's tokenizer."
    )


def test_the_methods_a_pair_gets(tmp_path):
    paths = furnished_home(tmp_path)
    windowed = write_gguf(tmp_path / "my/gemma.gguf", architecture="gemma2", sliding_window=16)
    eagle3_head(tmp_path / "my/head", len(LLAMA_TOKENS), 64)
    found = discover([tmp_path / "my"], home=tmp_path, environ={})
    target, draft = found.model(str(paths["target"])), found.model(str(paths["gpt4all draft"]))
    assert pair_methods(target, draft, has_draft_model=True, has_eagle_head=True) == (
        "auto", "ar", "chain", "tree", "staged", "ngram", "eagle", "eagle-tree",
    )
    # No draft model: n-gram lookup always drafts (chain by prompt lookup, and the n-gram model).
    assert pair_methods(target, None, has_draft_model=False, has_eagle_head=False) == ("auto", "ar", "chain", "ngram")
    # Sliding-window attention drops old positions: no token trees.
    assert pair_methods(found.model(str(windowed)), draft, has_draft_model=True, has_eagle_head=True) == (
        "auto", "ar", "chain", "ngram", "eagle",
    )
    assert len(found.heads) == 2
