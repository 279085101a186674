"""The streaming API: event order, stopping, budgets, bad input; and one real generation
with the demo target."""
from __future__ import annotations

import pytest
import torch

import engine.session
from engine.chat_prompt import Message
from engine.config import ConfigError, DecodeSettings, PairConfig, ModelSpec, demo_pair
from engine.errors import ContextOverflowError, PromptError
from engine.events import Finished, PromptPrepared, PromptProgress, Provenance, StatsUpdate, TextDelta
from engine.models import LoadedModel
from engine.session import LoadedPair
from tests.engine.tiny_models import TEMPLATE, WORDS, tiny_llama, tiny_word_pair


@pytest.fixture
def tiny_pair(make_word_tokenizer):
    return tiny_word_pair(make_word_tokenizer)


def run(generation) -> list:
    return list(generation)


def test_events_come_in_order_and_add_up(tiny_pair):
    events = run(tiny_pair.generate([Message("user", "w1 w2 w3 w1 w2")], DecodeSettings(max_new_tokens=20)))
    assert isinstance(events[0], PromptPrepared)
    assert isinstance(events[-1], Finished)
    assert isinstance(events[-2], StatsUpdate)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    finished = events[-1]
    assert tuple(t for d in deltas for t in d.token_ids) == finished.token_ids
    assert tuple(p for d in deltas for p in d.provenance) == finished.provenance
    assert "".join(d.text for d in deltas).strip() == finished.text.strip()
    assert all(len(d.pieces) == len(d.token_ids) and "".join(d.pieces) == d.text for d in deltas)
    assert finished.stop_reason == "length"
    assert len(finished.token_ids) == 20 == finished.stats.tokens_generated
    assert finished.stats.target_calls == len(deltas)
    assert finished.stats.time_to_first_token_s is not None


def test_greedy_chain_equals_ar_through_the_session(tiny_pair):
    outputs = {}
    for method in ("ar", "chain"):
        events = run(tiny_pair.generate([Message("user", "w5 w6 w7 w5 w6 w7")], DecodeSettings(method=method, max_new_tokens=30)))
        outputs[method] = events[-1]
    assert outputs["chain"].token_ids == outputs["ar"].token_ids
    assert set(outputs["ar"].provenance) == {Provenance.TARGET}
    assert outputs["ar"].stats.target_calls == 30


def test_sampling_with_a_seed_is_reproducible(tiny_pair):
    settings = DecodeSettings(temperature=0.9, top_p=0.95, max_new_tokens=25, seed=11)
    first = run(tiny_pair.generate([Message("user", "w1 w2")], settings))[-1]
    second = run(tiny_pair.generate([Message("user", "w1 w2")], settings))[-1]
    assert first.token_ids == second.token_ids


def test_stop_takes_effect_after_the_current_round(tiny_pair):
    generation = tiny_pair.generate([Message("user", "w1 w2")], DecodeSettings(max_new_tokens=60))
    deltas = 0
    finished = None
    for event in generation:
        if isinstance(event, TextDelta):
            deltas += 1
            generation.stop()
        if isinstance(event, Finished):
            finished = event
    assert deltas == 1
    assert finished.stop_reason == "stopped"
    assert 0 < len(finished.token_ids) < 60


def test_stop_token_ends_the_reply_and_is_not_shown(tiny_pair):
    # Make the target's greedy choice after the prompt a stop token.
    first = run(tiny_pair.generate([Message("user", "w9")], DecodeSettings(method="ar", max_new_tokens=5)))[-1]
    tiny_pair.stop_token_ids = frozenset({first.token_ids[2]})
    finished = run(tiny_pair.generate([Message("user", "w9")], DecodeSettings(max_new_tokens=5)))[-1]
    assert finished.stop_reason == "eos"
    assert finished.token_ids == first.token_ids[:2]


def test_empty_message_is_refused(tiny_pair):
    with pytest.raises(PromptError):
        run(tiny_pair.generate([Message("user", "   ")], DecodeSettings()))


def test_message_longer_than_the_context_is_refused(tiny_pair):
    with pytest.raises(ContextOverflowError):
        run(tiny_pair.generate([Message("user", " ".join(WORDS[:50] * 2))], DecodeSettings(max_new_tokens=8)))


def test_old_turns_are_dropped_and_reported(tiny_pair):
    history = []
    for turn in range(8):
        history += [Message("user", " ".join(WORDS[turn : turn + 6])), Message("assistant", " ".join(WORDS[turn + 6 : turn + 12]))]
    history.append(Message("user", "w1 w2"))
    events = run(tiny_pair.generate(history, DecodeSettings(max_new_tokens=8)))
    assert events[0].dropped_turns > 0
    assert events[-1].dropped_turns == events[0].dropped_turns
    assert events[0].prompt_tokens <= tiny_pair.context_length


def test_generation_stops_at_the_end_of_the_context(tiny_pair):
    finished = run(tiny_pair.generate([Message("user", " ".join(WORDS[:20]))], DecodeSettings(max_new_tokens=500)))[-1]
    assert finished.stop_reason == "context"  # not the token limit: Continue is not offered
    assert finished.stats.prompt_tokens + len(finished.token_ids) <= tiny_pair.context_length


def test_a_text_prompt_is_continued_as_it_is_without_the_chat_template(tiny_pair):
    text = "w5 w6 w7 w5 w6"
    events = run(tiny_pair.complete(text, DecodeSettings(method="ar", max_new_tokens=6)))
    assert events[0].prompt_tokens == 5  # the words alone, without the template's <s> and </s>
    ids = tiny_pair.tokenizer.encode(text)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(tiny_pair.target.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(events[-1].token_ids) == ids[5:]  # what the target alone continues the text with


def test_a_text_prompt_longer_than_the_context_is_refused(tiny_pair):
    with pytest.raises(ContextOverflowError, match="The prompt is 100 tokens long"):
        run(tiny_pair.complete(" ".join(WORDS[:50] * 2), DecodeSettings(max_new_tokens=8)))


def test_unknown_method_is_refused():
    with pytest.raises(ConfigError, match="unknown method"):
        DecodeSettings(method="magic")


def test_demo_target_answers_a_real_question(demo_target):
    pair = LoadedPair(demo_pair(), demo_target, None)
    events = run(pair.generate([Message("user", "What is the capital of France?")], DecodeSettings(max_new_tokens=16)))
    finished = events[-1]
    assert "Paris" in finished.text
    assert finished.stats.tokens_per_s > 0
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == finished.text


def calibrated_pair_with_a_draft(make_word_tokenizer) -> LoadedPair:
    """A tiny target and draft whose tree verify costs were measured, as load_pair does."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=96)
    draft = LoadedModel(tiny_llama(seed=4, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=96)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), target, draft)
    pair.stop_token_ids = frozenset()
    pair.calibrate_trees()
    return pair


def test_trees_are_calibrated_once_at_load_so_no_reply_waits_for_it(make_word_tokenizer, monkeypatch):
    pair = calibrated_pair_with_a_draft(make_word_tokenizer)
    shapes = pair.auto_tree_shapes
    assert set(shapes) == {"tree", "staged"}
    assert shapes["tree"].verify_seconds and shapes["tree"].verify_seconds == shapes["staged"].verify_seconds
    assert len(pair.target_runner) == 0  # the probe leaves nothing behind

    def no_more_timing(*args):
        raise AssertionError("a reply measured the verify cost again")

    monkeypatch.setattr(engine.session, "time_verify", no_more_timing)
    for method in ("tree", "staged"):
        events = run(pair.generate([Message("user", "w1 w2 w3")], DecodeSettings(method=method, max_new_tokens=8)))
        assert len(events[-1].token_ids) == 8


def test_chains_keep_their_length_across_replies_priced_by_the_verify_curve_measured_at_load(make_word_tokenizer):
    pair = calibrated_pair_with_a_draft(make_word_tokenizer)
    settings = DecodeSettings(method="chain", max_new_tokens=12, draft_tokens=3)
    run(pair.generate([Message("user", "w1 w2 w3")], settings))
    length = pair.chain_lengths["chain"]
    assert length.rounds > 0 and sum(length.tried) > 0  # the reply's rounds were learnt from
    calibrated = pair.auto_tree_shapes["tree"].verify_seconds
    assert set(calibrated) <= set(length.verify_seconds)  # priced off the curve measured at load
    run(pair.generate([Message("user", "w2 w3")], settings))
    assert pair.chain_lengths["chain"] is length  # the next reply goes on from what it learnt
    # auto's chain of the draft model is the same drafter, so it shares what was learnt
    run(pair.generate([Message("user", "w3")], DecodeSettings(method="auto", max_new_tokens=6, draft_tokens=3)))
    assert pair.chain_lengths["chain"] is length
    # another K is another length, priced off the same curve
    assert pair.chain_length("chain", 5) is not length and pair.chain_lengths["chain"].most == 5
    assert set(calibrated) <= set(pair.chain_lengths["chain"].verify_seconds)


def test_plain_decoding_makes_one_token_per_target_call_when_a_stop_token_ends_it(tiny_pair):
    # The call that produced the stop token counts, so the stop token counts too (issue 13: `ar` showed 0.88).
    first = run(tiny_pair.generate([Message("user", "w9")], DecodeSettings(method="ar", max_new_tokens=5)))[-1]
    tiny_pair.stop_token_ids = frozenset({first.token_ids[2]})
    finished = run(tiny_pair.generate([Message("user", "w9")], DecodeSettings(method="ar", max_new_tokens=5)))[-1]
    assert finished.stop_reason == "eos"
    assert finished.stats.tokens_generated == 2
    assert finished.stats.target_calls == 3
    assert finished.stats.mean_accepted_per_target_call == 1.0
    assert finished.stats.target_calls_saved == 0


def interrupt_target_call(pair, call: int) -> None:
    """Make the target's `call`-th forward raise KeyboardInterrupt, as Ctrl-C does mid-round
    (every round runs the target once, as a tree: a chain or the root alone)."""
    forward = pair.target_runner.forward_tree
    calls = 0

    def interrupted_forward(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == call:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    pair.target_runner.forward_tree = interrupted_forward


def test_an_interrupted_generation_keeps_the_reply_streamed_so_far(tiny_pair):
    interrupt_target_call(tiny_pair, 5)  # `ar`: four tokens streamed, then Ctrl-C
    generation = tiny_pair.generate([Message("user", "w1 w2")], DecodeSettings(method="ar", max_new_tokens=20))
    streamed: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        for event in generation:
            if isinstance(event, TextDelta):
                streamed += event.token_ids
    finished = generation.result_so_far()
    assert len(streamed) == 4
    assert finished.stop_reason == "stopped"
    assert finished.token_ids == tuple(streamed)
    assert finished.text == tiny_pair.tokenizer.decode(streamed, skip_special_tokens=True)
    assert finished.stats.tokens_generated == 4


def test_a_generation_runs_once_and_refuses_a_second_iteration(tiny_pair):
    generation = tiny_pair.generate([Message("user", "w1 w2")], DecodeSettings(max_new_tokens=4))
    for event in generation:
        generation.stop()
    with pytest.raises(RuntimeError, match="already ran"):
        list(generation)


def long_context_pair(make_word_tokenizer, with_draft: bool = False) -> LoadedPair:
    """The tiny word pair with room for prompts of over a thousand tokens, and a draft if asked."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")

    def model(seed: int) -> LoadedModel:
        return LoadedModel(tiny_llama(seed=seed, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32,
                           "fp32", "tiny", context_length=1536)

    pair = LoadedPair(
        PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft") if with_draft else None),
        model(3), model(4) if with_draft else None,
    )
    pair.stop_token_ids = frozenset()
    return pair


LONG_MESSAGE = " ".join(WORDS[i % 50] for i in range(1200))  # about 1,200 prompt tokens


def test_a_long_prompt_is_read_with_progress_before_the_first_text(make_word_tokenizer):
    pair = long_context_pair(make_word_tokenizer)
    events = run(pair.generate([Message("user", LONG_MESSAGE)], DecodeSettings(method="ar", max_new_tokens=4)))
    first_text = next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    progress = [e for e in events if isinstance(e, PromptProgress)]
    assert all(isinstance(e, PromptProgress) for e in events[1:first_text])
    assert len(progress) == first_text - 1 >= 5  # 0%, then one per 256-token chunk
    prompt_tokens = events[0].prompt_tokens
    assert {e.tokens_total for e in progress} == {prompt_tokens - 1}  # the last token is the first round's
    done = [e.tokens_done for e in progress]
    assert done[0] == 0 and done == sorted(set(done)) and progress[-1].fraction == 1.0
    assert events[-1].stats.target_calls == 4  # reading the prompt is not a round


def test_a_short_prompt_or_a_cached_conversation_is_read_without_progress(make_word_tokenizer):
    pair = long_context_pair(make_word_tokenizer)
    settings = DecodeSettings(method="ar", max_new_tokens=4)
    assert not any(isinstance(e, PromptProgress) for e in run(pair.generate([Message("user", "w1 w2 w3")], settings)))
    first = run(pair.generate([Message("user", LONG_MESSAGE)], settings))[-1]
    follow_up = [Message("user", LONG_MESSAGE), Message("assistant", first.text), Message("user", "w4 w5")]
    assert not any(isinstance(e, PromptProgress) for e in run(pair.generate(follow_up, settings)))  # cached


@pytest.mark.parametrize("method", ["ar", "chain", "tree"])
def test_reading_a_prompt_in_chunks_gives_the_reply_of_one_forward(make_word_tokenizer, monkeypatch, method):
    settings = DecodeSettings(method=method, max_new_tokens=24, tree_shape="8x3")
    messages = [Message("user", LONG_MESSAGE)]
    chunked = run(long_context_pair(make_word_tokenizer, with_draft=True).generate(messages, settings))
    assert any(isinstance(e, PromptProgress) for e in chunked)
    monkeypatch.setattr(engine.session, "PROMPT_PROGRESS_MIN_TOKENS", 10**6)
    whole = run(long_context_pair(make_word_tokenizer, with_draft=True).generate(messages, settings))
    assert not any(isinstance(e, PromptProgress) for e in whole)
    assert chunked[-1].token_ids == whole[-1].token_ids
    reference = run(long_context_pair(make_word_tokenizer).generate(messages, settings.with_changes(method="ar")))
    assert chunked[-1].token_ids == reference[-1].token_ids  # greedy speculative output is the target's


def test_stopping_while_a_prompt_is_read_ends_the_reply_before_its_first_token(make_word_tokenizer):
    pair = long_context_pair(make_word_tokenizer)
    generation = pair.generate([Message("user", LONG_MESSAGE)], DecodeSettings(method="ar", max_new_tokens=4))
    events = []
    for event in generation:
        events.append(event)
        if isinstance(event, PromptProgress) and event.tokens_done > 0:
            generation.stop()
    assert [e.tokens_done for e in events if isinstance(e, PromptProgress)] == [0, 256]
    assert events[-1].stop_reason == "stopped" and events[-1].token_ids == ()


def test_the_heap_is_trimmed_once_a_reply_is_written_and_stopped_replies_too(tiny_pair, monkeypatch):
    """A reply's rounds free tens of MB of logits; the trim before Finished gives them back to
    the system, so an idle app does not sit on its last reply's peak (tandem soak)."""
    seen: list[str] = []

    def trim() -> None:
        seen.append("trim")

    monkeypatch.setattr(engine.session.heap, "trim", trim)
    events = []
    for event in tiny_pair.generate([Message("user", "w1 w2 w3")], DecodeSettings(max_new_tokens=6)):
        events.append(event)
        seen.append(type(event).__name__)
    assert seen[-2:] == ["trim", "Finished"] and seen.count("trim") == 1
    generation = tiny_pair.generate([Message("user", "w1 w2 w3")], DecodeSettings(max_new_tokens=50))
    for event in generation:
        if isinstance(event, TextDelta):
            generation.stop()
        seen.append(type(event).__name__)
    assert seen.count("trim") == 2 and seen[-1] == "Finished"


def test_a_continued_reply_is_the_reply_that_was_not_cut(tiny_pair):
    """Continue (a conversation that ends with the reply so far): greedy, a reply cut at 5
    tokens and carried on for 7 more is the 12-token reply written in one go."""
    question = [Message("user", "w1 w2 w3 w1 w2")]
    whole = run(tiny_pair.generate(question, DecodeSettings(method="ar", max_new_tokens=12)))[-1]
    cut = run(tiny_pair.generate(question, DecodeSettings(method="ar", max_new_tokens=5)))[-1]
    assert cut.token_ids == whole.token_ids[:5]
    rest = run(tiny_pair.generate([*question, Message("assistant", cut.text)], DecodeSettings(method="chain", max_new_tokens=7)))[-1]
    assert cut.token_ids + rest.token_ids == whole.token_ids
    assert cut.text + rest.text == whole.text  # the space between the two parts is kept


def test_an_interrupted_continue_keeps_the_space_before_its_text(tiny_pair):
    """Ctrl-C during a continue: the reply so far plus what result_so_far gives reads as the
    uncut reply does (the new text decoded after the reply's last tokens)."""
    question = [Message("user", "w1 w2 w3 w1 w2")]
    whole = run(tiny_pair.generate(question, DecodeSettings(method="ar", max_new_tokens=12)))[-1]
    cut = run(tiny_pair.generate(question, DecodeSettings(method="ar", max_new_tokens=5)))[-1]
    interrupt_target_call(tiny_pair, 5)  # four more tokens, then Ctrl-C
    generation = tiny_pair.generate([*question, Message("assistant", cut.text)], DecodeSettings(method="ar", max_new_tokens=7))
    with pytest.raises(KeyboardInterrupt):
        list(generation)
    rest = generation.result_so_far()
    assert len(rest.token_ids) == 4
    assert whole.text.startswith(cut.text + rest.text)


def test_measuring_the_tree_costs_again_keeps_the_conversation_cached(make_word_tokenizer):
    """After a background compile the tree costs are measured again mid-chat: the target's
    cache keeps the conversation (all but its last token), so the next reply does not read
    it all again."""
    from engine.chat_prompt import Message
    from engine.config import DecodeSettings
    from tests.engine.runtime.test_torch_static import static, tiny_pair

    pair = tiny_pair(make_word_tokenizer, lambda model: static(model, capacity=200))
    assert pair.auto_tree_shapes
    list(pair.generate([Message("user", "w1 w2 w3")], DecodeSettings(method="ar", max_new_tokens=10)))
    conversation = list(pair.target_runner.cached_ids)
    assert len(conversation) > 10
    pair.calibrate_trees(again=True)
    assert all(shape.calibrated for shape in pair.auto_tree_shapes.values())
    assert pair.target_runner.cached_ids == conversation[:-1]


def test_the_compile_setting_does_not_orphan_a_pairs_speed_record():
    import dataclasses

    from engine.config import ModelSpec, PairConfig
    from engine.session import _pair_key

    class Target:
        runtime, precision = "llama.cpp", "int8"

    config = PairConfig("p", ModelSpec("t.gguf"), ModelSpec("d.gguf"))
    assert _pair_key(config, Target) == _pair_key(dataclasses.replace(config, compile=False), Target)
    assert _pair_key(config, Target) != _pair_key(dataclasses.replace(config, runtime="torch"), Target)
