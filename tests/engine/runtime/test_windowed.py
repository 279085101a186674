"""A draft that reads only the end of a long prompt (engine/runtime/windowed.py)."""
from __future__ import annotations

import random

import pytest
import torch

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.events import Finished, PromptProgress
from engine.models import LoadedModel
from engine.runtime.torch_eager import TorchRuntime
from engine.runtime.windowed import WindowedRuntime
from engine.session import LoadedPair
from tests.engine.tiny_models import TEMPLATE, WORDS, tiny_llama

WINDOW = 6


def windowed(seed: int = 5) -> tuple[WindowedRuntime, torch.nn.Module]:
    model = tiny_llama(seed=seed)
    return WindowedRuntime(TorchRuntime(model, torch.device("cpu")), WINDOW), model


def alone(model: torch.nn.Module, ids: list[int], wanted: int = 1) -> torch.Tensor:
    """The logits of the model over `ids` and nothing else."""
    return TorchRuntime(model, torch.device("cpu")).forward(ids, logits_wanted=wanted)


def test_a_long_read_is_cut_to_the_window_before_the_last_token():
    runtime, model = windowed()
    context = list(range(3, 23))  # 20 tokens
    pending = runtime.pending(context)
    assert pending == context[-WINDOW - 1 :]
    logits = runtime.forward(pending, logits_wanted=2)
    assert len(runtime) == len(context) and runtime.cached_ids == context
    assert len(runtime.inner) == WINDOW + 1, "the draft's own cache holds only the window"
    assert runtime.first_attended_slot() == len(context) - WINDOW - 1
    torch.testing.assert_close(logits, alone(model, pending, 2))


def test_a_short_read_and_a_growing_conversation_keep_the_whole_cache():
    runtime, model = windowed()
    runtime.forward(runtime.pending([3, 4, 5, 6, 7]))
    assert runtime.first_attended_slot() == 0
    context = [3, 4, 5, 6, 7, 8, 9, 10]
    assert runtime.pending(context) == [8, 9, 10], "a few new tokens are read after the cached ones"
    logits = runtime.forward([8, 9, 10])
    assert len(runtime.inner) == len(context) and runtime.first_attended_slot() == 0
    torch.testing.assert_close(logits, alone(model, context))


def test_a_tree_over_the_window_and_its_kept_path_give_the_windows_chain_logits():
    runtime, model = windowed()
    context = list(range(3, 21))
    runtime.forward(runtime.pending(context)[:-1])
    start = runtime.first_attended_slot()
    last = len(context) - 1  # the root: the context's last token, not read yet
    # the last token, then two children of it; the first child has a child of its own
    tree_logits = runtime.forward_tree([context[-1], 30, 31, 32], [last - 1, last, last, last + 1], logits_wanted=4)
    path = context[start:] + [30, 32]
    torch.testing.assert_close(tree_logits[[0, 1, 3]], alone(model, path, 3), atol=1e-4, rtol=1e-4)
    runtime.keep_slots(last + 1, [last + 1, last + 3])
    assert runtime.cached_ids == context + [30, 32]
    assert runtime.inner.cached_ids == path
    torch.testing.assert_close(runtime.forward([40]), alone(model, path + [40]), atol=1e-4, rtol=1e-4)


def test_cropping_into_the_text_before_the_window_reads_the_window_again():
    runtime, model = windowed()
    context = list(range(3, 23))
    runtime.forward(runtime.pending(context))
    runtime.crop(5)  # an early message edited: what stays is all before the window
    assert len(runtime) == 5 and len(runtime.inner) == 0 and runtime.first_attended_slot() == 5
    edited = context[:5] + [40, 41, 42]  # longer than the window: its end
    assert runtime.pending(edited) == edited[-WINDOW - 1 :]
    torch.testing.assert_close(runtime.forward(edited[-WINDOW - 1 :]), alone(model, edited[-WINDOW - 1 :]))

    runtime.forward(runtime.pending(context)[:-1])  # the long text again
    runtime.crop(3)
    short = context[:3] + [40]  # within the window: the draft reads all of it, its start too
    assert runtime.pending(short) == short and runtime.first_attended_slot() == 0
    torch.testing.assert_close(runtime.forward(short), alone(model, short))


def test_a_tree_cannot_branch_from_text_outside_the_window():
    runtime, _ = windowed()
    context = list(range(3, 23))
    runtime.forward(runtime.pending(context))
    with pytest.raises(ValueError, match="outside the draft's window"):
        runtime.forward_tree([30], [2], logits_wanted=1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method", ["chain", "tree", "staged"])
def test_greedy_decoding_with_a_windowed_draft_equals_the_target_alone(make_word_tokenizer, method, seed):
    """Exactness does not depend on what the draft read: it only proposes."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3 + seed), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=128)
    draft = LoadedModel(tiny_llama(seed=11 + seed), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny-draft", context_length=128)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), target, draft, draft_window=WINDOW)
    pair.stop_token_ids = frozenset()
    prompt = " ".join(random.Random(seed).choices(WORDS, k=30))  # longer than the window

    def reply(name: str) -> tuple[int, ...]:
        pair.reset_caches()
        settings = DecodeSettings(method=name, max_new_tokens=24, tree_shape="8x3", draft_tokens=3)
        events = list(pair.generate([Message("user", prompt)], settings))
        return next(event for event in events if isinstance(event, Finished)).token_ids

    speculative = reply(method)
    assert pair.draft_runner.first_attended_slot() > 0, "the draft read only the end of the prompt"
    assert speculative == reply("ar")


def test_a_long_prompt_read_in_chunks_reaches_the_draft_as_its_window(make_word_tokenizer, monkeypatch):
    """The session reads a long prompt into every model a chunk at a time before the first
    round, from where each model's `pending` says its read begins: the draft's chunks are
    the window's, and its cache then equals a fresh read of that window."""
    import engine.session
    from engine.tools.reply_score import cache_gap

    monkeypatch.setattr(engine.session, "PROMPT_PROGRESS_MIN_TOKENS", 8)
    monkeypatch.setattr(engine.session, "PROMPT_CHUNK_TOKENS", 4)
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=128)
    draft_model = tiny_llama(seed=11)
    draft = LoadedModel(draft_model, tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny-draft", context_length=128)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), target, draft, draft_window=WINDOW)
    pair.stop_token_ids = frozenset()
    prompt = " ".join(random.Random(0).choices(WORDS, k=40))
    draft_read_before_the_first_round = None
    events = []
    for event in pair.generate([Message("user", prompt)], DecodeSettings(method="chain", max_new_tokens=8, draft_tokens=3)):
        events.append(event)
        if isinstance(event, PromptProgress) and event.tokens_done == event.tokens_total:
            draft_read_before_the_first_round = len(pair.draft_runner.inner)
    read = [event for event in events if isinstance(event, PromptProgress)]
    assert read and read[-1].tokens_total > 40, "the target read the whole prompt in chunks"
    assert draft_read_before_the_first_round == WINDOW, "the draft read the window before the last token"
    gap = cache_gap(pair.draft_runner, TorchRuntime(draft_model, torch.device("cpu")))
    assert gap is not None and gap < 1e-4
