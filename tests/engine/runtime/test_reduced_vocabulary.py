"""A reduced-vocabulary draft behind the full-vocabulary runtime contract (issue 12)."""
from __future__ import annotations

import random

import pytest
import torch

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.events import Finished
from engine.models import LoadedModel, load_model
from engine.runtime.reduced_vocabulary import ReducedVocabulary, ReducedVocabularyRuntime
from engine.runtime.torch_eager import TorchRuntime
from engine.session import LoadedPair
from tests.engine.tiny_models import TEMPLATE, WORDS, tiny_gguf, tiny_llama

FULL = 64
KEPT = (0, 1, 2, 3, 5, 8, 13, 21, 34, 40, 41, 42, 50, 55, 60, 61, 62, 63)  # model ids 0..17, 18 = other


@pytest.fixture
def vocabulary() -> ReducedVocabulary:
    return ReducedVocabulary(KEPT, FULL)


def reduced_runtime(vocabulary: ReducedVocabulary, seed: int = 7) -> tuple[ReducedVocabularyRuntime, torch.nn.Module]:
    model = tiny_llama(seed=seed, vocab_size=vocabulary.size)
    return ReducedVocabularyRuntime(TorchRuntime(model, torch.device("cpu")), vocabulary), model


def test_ids_map_into_the_model_and_logits_back_out(vocabulary):
    assert vocabulary.to_model_ids([0, 5, 63, 4, 33]) == [0, 4, 17, 18, 18]
    assert vocabulary.to_model_ids(torch.tensor([[8, 9]])).tolist() == [[5, 18]]
    runtime, model = reduced_runtime(vocabulary)
    ids = [1, 5, 8, 40, 62]
    logits = runtime.forward(ids, logits_wanted=len(ids))
    assert logits.shape == (len(ids), FULL)
    with torch.no_grad():
        expected = model(torch.tensor([vocabulary.to_model_ids(ids)])).logits[0]
    torch.testing.assert_close(logits[:, list(KEPT)], expected[:, : vocabulary.other_id])
    unknown = [token for token in range(FULL) if token not in KEPT]
    assert torch.isneginf(logits[:, unknown]).all(), "a token the draft does not keep must never be proposed"


def test_tokens_the_draft_does_not_keep_read_as_one_shared_token(vocabulary):
    runtime, _ = reduced_runtime(vocabulary)
    first = runtime.forward([1, 5, 4, 8])  # 4 and 7 are not kept
    runtime.reset()
    second = runtime.forward([1, 5, 7, 8])
    torch.testing.assert_close(first, second)


def test_a_tree_and_its_kept_path_give_the_chains_logits(vocabulary):
    runtime, _ = reduced_runtime(vocabulary)
    fresh, _ = reduced_runtime(vocabulary)
    runtime.forward([1, 2, 3])
    # root 5 with children 8 and 13; 8 has child 21
    tree_logits = runtime.forward_tree([5, 8, 13, 21], [2, 3, 3, 4], logits_wanted=4)
    chain = fresh.forward([1, 2, 3, 5, 8, 21], logits_wanted=3)
    torch.testing.assert_close(tree_logits[[0, 1, 3]], chain, atol=1e-4, rtol=1e-4)
    runtime.keep_slots(3, [3, 4, 6])
    assert runtime.cached_ids == [1, 2, 3, 5, 8, 21]
    assert runtime.inner.cached_ids == vocabulary.to_model_ids([1, 2, 3, 5, 8, 21])
    assert len(runtime.inner) == 6
    torch.testing.assert_close(runtime.forward([34]), fresh.forward([34]), atol=1e-4, rtol=1e-4)
    runtime.crop(2)
    assert len(runtime.inner) == 2


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method", ["chain", "tree", "staged"])
def test_greedy_decoding_with_a_reduced_draft_equals_the_target_alone(make_word_tokenizer, vocabulary, method, seed):
    """Exactness does not depend on the draft knowing every token: whatever it cannot
    propose, the target supplies."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3 + seed, vocab_size=FULL), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=96)
    draft_model = tiny_llama(seed=11 + seed, vocab_size=vocabulary.size)
    draft = LoadedModel(draft_model, tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny-draft", context_length=96, vocabulary=vocabulary)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), target, draft)
    pair.stop_token_ids = frozenset()
    prompt = " ".join(random.Random(seed).choices(WORDS, k=5))

    def reply(name: str) -> tuple[int, ...]:
        pair.reset_caches()
        settings = DecodeSettings(method=name, max_new_tokens=24, tree_shape="8x3", draft_tokens=3)
        events = list(pair.generate([Message("user", prompt)], settings))
        return next(event for event in events if isinstance(event, Finished)).token_ids

    assert reply(method) == reply("ar")


def test_a_reduced_draft_folder_loads_reduced_on_torch_and_on_llamacpp(tmp_path, vocabulary):
    """The folder's draft-vocabulary.json makes both runtimes speak the full vocabulary, and
    the GGUF export carries the reduced vocabulary that llama.cpp then runs."""
    pytest.importorskip("llama_cpp")
    model = tiny_llama(seed=9, vocab_size=vocabulary.size)
    folder = tmp_path / "draft"
    full_tokenizer_model = tiny_llama(seed=9, vocab_size=FULL)
    tiny_gguf(full_tokenizer_model, folder)  # the tokenizer files of the full vocabulary
    for stale in folder.glob("*.gguf"):
        stale.unlink()
    model.save_pretrained(folder)
    vocabulary.save(folder)
    from engine.tools.export_gguf import export_gguf

    export_gguf(folder, precision="f32")
    on_torch = load_model(ModelSpec(str(folder), "fp32", "cpu"), runtime="torch")
    on_llamacpp = load_model(ModelSpec(str(folder), "auto", "cpu"), runtime="llama.cpp", as_draft=True)
    assert on_torch.vocabulary == on_llamacpp.vocabulary == vocabulary
    ids = [1, 5, 9, 40, 62, 63]
    expected = on_torch.open_runtime().forward(ids, logits_wanted=3)
    actual = on_llamacpp.open_runtime().forward(ids, logits_wanted=3)
    assert actual.shape == expected.shape == (3, FULL)
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    kept = list(KEPT)
    assert (actual[:, kept] - expected[:, kept]).abs().max() < 1e-3 * expected[:, kept].abs().max()
    on_llamacpp.close()


def test_a_damaged_vocabulary_file_is_a_clear_error(tmp_path):
    from engine.errors import ModelLoadError

    (tmp_path / "draft-vocabulary.json").write_text('{"full_size": 4, "kept_ids": [1, 9]}', encoding="utf-8")
    with pytest.raises(ModelLoadError, match="vocabulary"):
        ReducedVocabulary.load(tmp_path)
    assert ReducedVocabulary.load(tmp_path / "elsewhere") is None


@torch.inference_mode()
def test_the_full_vocabulary_view_lets_transformers_assist_with_a_reduced_draft(vocabulary):
    """transformers' assisted generation needs its assistant on the target's vocabulary: the
    view takes full ids and gives full logits (−inf outside the kept tokens), sharing the
    weights, and greedy assisted generation then writes what the target alone writes."""
    from engine.runtime.reduced_vocabulary import full_vocabulary_view

    model = tiny_llama(seed=7, vocab_size=vocabulary.size)
    view = full_vocabulary_view(model, vocabulary)
    ids = torch.tensor([[1, 5, 8, 40, 62, 9]])
    logits = view(input_ids=ids).logits
    assert logits.shape == (1, 6, FULL) and view.config.vocab_size == FULL
    torch.testing.assert_close(logits[0], vocabulary.full_logits(model(vocabulary.to_model_ids(ids)).logits[0]))
    assert torch.isinf(logits[..., [4, 33]]).all(), "a token the draft does not keep is never proposed"
    assert view.model is model.model and model.config.vocab_size == vocabulary.size  # shared, model untouched

    target = tiny_llama(seed=3, vocab_size=FULL)
    prompt = torch.tensor([[1, 2, 3, 5, 8]])
    options = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    alone = target.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
    assisted = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=view, **options)
    assert assisted.tolist() == alone.tolist()
