"""The data side of `tandem distill` at scale (issue 12): prompts the target writes itself,
and replies written many at a time by the one reply writer over each runtime's sequence batch
(llama.cpp, the native int8 forward, torch): each greedy reply is the one that runtime writes
decoding the prompt alone."""
from __future__ import annotations

import json

import pytest
import torch

from engine.tools.distill.prompts import SYNTHETIC_FILE, synthesize_prompts, user_turn_prefix
from engine.tools.distill.replies import Job, Reply
from engine.tools.distill.writer import BatchReplyWriter
from tests.engine.tiny_models import TEMPLATE, WORDS


class ScriptedWriter:
    """Stands in for the target: reply `key` is `script[key]`, finished in reverse key order
    within each group of four (replies end in any order), ended by token 0 unless cut."""

    sequence_tokens = 512

    def __init__(self, script: dict[int, list[int] | None]):
        self.script = script
        self.asked: list[int] = []

    def write(self, jobs, max_new_tokens, temperature, stored_top_k, stop_ids, should_stop=lambda: False):
        group = []
        for job in jobs:
            group.append(job)
            if len(group) == 4:
                yield from self._finish(group, max_new_tokens)
                group = []
            if should_stop():
                return
        yield from self._finish(group, max_new_tokens)

    def _finish(self, group, max_new_tokens):
        for job in reversed(group):
            self.asked.append(job.key)
            words = self.script.get(job.key, [])
            stopped = words is not None
            ids = (words + [0]) if stopped else [5] * max_new_tokens
            empty = torch.empty((len(ids), 0))
            yield Reply(job.key, job.prompt_ids, ids, empty.int(), empty.half(), stopped, 1.0)


@pytest.fixture
def tokenizer(make_word_tokenizer):
    return make_word_tokenizer(WORDS, chat_template=TEMPLATE)


def word_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_prefix_is_the_chat_template_up_to_the_users_words(tokenizer):
    prefix = user_turn_prefix(tokenizer)
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "w1 w2"}], tokenize=True)
    whole = whole["input_ids"] if isinstance(whole, dict) or hasattr(whole, "keys") else whole
    assert prefix and whole[: len(prefix)] == prefix
    assert tokenizer.decode(whole[len(prefix) :]).split()[:2] == ["w1", "w2"]


def test_synthetic_prompts_are_whole_new_and_distinct_and_resume_without_repeats(tokenizer, tmp_path):
    w = lambda text: word_ids(tokenizer, text)  # noqa: E731
    script = {
        0: w("w1 w2 w3"),
        1: w("w1 w2 w3"),  # a duplicate of 0
        2: w("w4"),  # too short
        3: None,  # never finished
        4: w("w7 w8 w9 w10"),  # a known prompt, in other case and spacing below
        5: w("w11 w12 w13"),
        6: w("w14 w15 w16"),
        7: w("w17 w18 w19"),
        8: w("w20 w21 w22"),
        9: w("w23 w24 w25"),
    }
    writer = ScriptedWriter(script)
    known = ["W7  w8 w9 w10"]
    got = synthesize_prompts(writer, tokenizer, 3, tmp_path, 0, frozenset({0}), known, lambda: False, lambda n: None)
    assert got == ["w1 w2 w3", "w11 w12 w13", "w14 w15 w16"]
    records = [json.loads(line) for line in (tmp_path / SYNTHETIC_FILE).read_text().splitlines()]
    reasons = {record["key"]: record["rejected"] for record in records}
    assert reasons[2] == "too short" and reasons[3] == "unfinished" and reasons[4] == "duplicate"
    assert reasons[1] == "duplicate" or reasons[0] == "duplicate"

    # Asking for more later continues after every attempt made so far, and never repeats one.
    more = ScriptedWriter(script)
    got = synthesize_prompts(more, tokenizer, 5, tmp_path, 0, frozenset({0}), known, lambda: False, lambda n: None)
    assert got == ["w1 w2 w3", "w11 w12 w13", "w14 w15 w16", "w17 w18 w19", "w20 w21 w22"]
    assert not set(more.asked) & set(writer.asked)


def test_a_stopped_synthesis_keeps_what_it_wrote(tokenizer, tmp_path):
    script = {key: word_ids(tokenizer, f"w{key} w{key + 1} w{key + 2}") for key in range(40)}
    writer = ScriptedWriter(script)
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 6

    assert synthesize_prompts(writer, tokenizer, 30, tmp_path, 0, frozenset({0}), [], stop, lambda n: None) is None
    written = len((tmp_path / SYNTHETIC_FILE).read_text().splitlines())
    assert 0 < written < 30
    got = synthesize_prompts(ScriptedWriter(script), tokenizer, 30, tmp_path, 0, frozenset({0}), [], lambda: False, lambda n: None)
    assert len(got) == 30 and len(set(got)) == 30


def test_continuous_batching_on_llamacpp_writes_each_reply_as_one_sequence_alone_would(demo_target_path):
    """More jobs than slots, prompts of different lengths: every slot is reused, and every
    greedy reply equals the same model decoding that prompt alone (llama.cpp runtime)."""
    pytest.importorskip("llama_cpp")
    from engine.runtime import llamacpp_library
    from engine.runtime.llamacpp_batch import LlamaCppSequenceBatch
    from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

    gguf = llamacpp_library.quantised_copy(demo_target_path, "fp32")
    prompts = [[1, 504, 3060, 28, 198] * (1 + index % 3) + [2] * index for index in range(7)]
    writer = BatchReplyWriter(LlamaCppSequenceBatch(gguf, slots=3, sequence_tokens=64, threads=1))
    try:
        jobs = [Job(key, prompt, torch.Generator().manual_seed(key)) for key, prompt in enumerate(prompts)]
        replies = {reply.key: reply for reply in writer.write(jobs, 6, 0.0, 4, frozenset())}
    finally:
        writer.close()
    assert sorted(replies) == list(range(7))

    weights = load_weights(gguf, use_gpu=False)
    try:
        for key, prompt in enumerate(prompts):
            runtime = LlamaCppRuntime(weights, 128, threads=1)
            logits = runtime.forward(prompt)
            expected = []
            for _ in range(6):
                token = int(logits[-1].argmax())
                expected.append(token)
                logits = runtime.forward([token])
            runtime.close()
            reply = replies[key]
            assert reply.reply_ids == expected, key
            assert reply.top_ids.shape == (6, 4) and reply.top_ids[:, 0].tolist() == expected
            assert torch.all(reply.top_logprobs[:, 0] >= reply.top_logprobs[:, 1])
            assert not reply.stopped
    finally:
        weights.close()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_continuous_batching_on_the_native_forward_writes_each_reply_as_one_sequence_alone_would(temperature):
    """More jobs than slots, prompts of different lengths (one past an attention range of 128
    rows): every slot is reused, and every reply, greedy or sampled with its own generator,
    equals the one the same int8 model writes for that prompt alone, token for token, with the
    same stored log-probs: a reply does not depend on which others share its forwards."""
    from engine.models import LoadedModel
    from engine.runtime import int8_kernel
    from engine.runtime.torch_static import StaticTorchRuntime
    from engine.tools.distill.replies import RunningReply, sample_next
    from engine.tools.distill.writer import native_batch
    from tests.engine.runtime.test_native_forward import VOCAB, int8_model

    if int8_kernel.unavailable_reason() is not None:
        pytest.skip("the int8 kernel cannot be built here")
    model = int8_model("llama", 17)
    target = LoadedModel(model, None, torch.device("cpu"), torch.float32, "int8-wo", "tiny int8", 256)
    prompts = [[(7 * index + step) % VOCAB for step in range(3 + 9 * index)] for index in range(6)] + [list(range(60)) * 2 + [5] * 10]
    new_tokens, stop = 12, frozenset({3})
    writer = BatchReplyWriter(native_batch(target, slots=3, sequence_tokens=160))
    jobs = [Job(key, prompt, torch.Generator().manual_seed(key)) for key, prompt in enumerate(prompts)]
    replies = {reply.key: reply for reply in writer.write(jobs, new_tokens, temperature, 4, stop)}
    writer.close()
    assert sorted(replies) == list(range(len(prompts)))

    for key, prompt in enumerate(prompts):
        runtime = StaticTorchRuntime(model, torch.device("cpu"), 160)
        alone = RunningReply(Job(key, prompt, torch.Generator().manual_seed(key)))
        logits = runtime.forward(prompt)
        while True:
            token = sample_next(logits[-1:], [alone], temperature, 4)[0]
            alone.reply.append(token)
            if token in stop or len(alone.reply) == new_tokens:
                break
            logits = runtime.forward([token])
        reply = replies[key]
        assert reply.reply_ids == alone.reply, key
        assert torch.equal(reply.top_logprobs, torch.stack(alone.top_logprobs))
        assert reply.stopped == (alone.reply[-1] in stop)
    assert 0 < sum(reply.stopped for reply in replies.values()) < len(prompts)  # a slot freed early too


def test_only_a_target_that_runs_natively_gets_the_native_writer():
    from engine.models import LoadedModel
    from engine.runtime import int8_kernel
    from engine.tools.distill.writer import native_batch, native_refusal
    from tests.engine.runtime.test_native_forward import int8_model
    from tests.engine.tiny_models import tiny_llama

    if int8_kernel.unavailable_reason() is not None:
        pytest.skip("the int8 kernel cannot be built here")
    cpu = torch.device("cpu")
    natively = LoadedModel(int8_model("llama", 18), None, cpu, torch.float32, "int8-wo", "int8", 64)
    in_float = LoadedModel(tiny_llama(18), None, cpu, torch.float32, "fp32", "fp32", 64)
    on_llamacpp = LoadedModel(None, None, cpu, None, "q8_0", "gguf", 64, runtime="llama.cpp", runtime_factory=lambda *a: None)
    assert native_refusal(natively) is None
    assert "int8" in native_refusal(in_float) and "llama.cpp" in native_refusal(on_llamacpp)
    with pytest.raises(ValueError, match="cannot write fp32's replies"):
        native_batch(in_float, 2, 32)


def test_batched_torch_writes_each_greedy_reply_as_the_torch_runtime_writes_it_alone():
    """Fixed batches over transformers' cache, prompts of different lengths left-padded, more
    jobs than slots, replies that stop early: every greedy reply is the torch runtime's plain
    decoding of that prompt alone."""
    from engine.runtime.torch_batch import TorchSequenceBatch
    from tests.engine.tiny_models import cached, tiny_llama

    model = tiny_llama(23)
    prompts = [[(5 * index + step) % 64 for step in range(2 + 3 * index)] for index in range(7)]
    new_tokens, stop = 10, frozenset({7, 11})
    writer = BatchReplyWriter(TorchSequenceBatch(model, torch.device("cpu"), 3, 64, usable_vocab=64, pad_id=0))
    jobs = [Job(key, prompt, torch.Generator().manual_seed(key)) for key, prompt in enumerate(prompts)]
    replies = {reply.key: reply for reply in writer.write(jobs, new_tokens, 0.0, 4, stop)}
    writer.close()
    assert sorted(replies) == list(range(len(prompts)))

    for key, prompt in enumerate(prompts):
        runtime = cached(model)
        logits = runtime.forward(prompt)
        expected = []
        while True:
            token = int(logits[-1].argmax())
            expected.append(token)
            if token in stop or len(expected) == new_tokens:
                break
            logits = runtime.forward([token])
        assert replies[key].reply_ids == expected, key
        assert replies[key].top_ids[:, 0].tolist() == expected
    assert 0 < sum(reply.stopped for reply in replies.values()) < len(prompts)  # a row ended early too
