"""The data side of `tandem distill` at scale (issue 12): prompts the target writes itself,
and replies written many at a time by continuous batching on llama.cpp."""
from __future__ import annotations

import json

import pytest
import torch

from engine.tools.distill.prompts import SYNTHETIC_FILE, synthesize_prompts, user_turn_prefix
from engine.tools.distill.replies import Job, Reply
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
    from engine.tools.distill.llamacpp_batch import LlamaCppBatchWriter
    from engine.runtime import llamacpp_library
    from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

    gguf = llamacpp_library.quantised_copy(demo_target_path, "fp32")
    prompts = [[1, 504, 3060, 28, 198] * (1 + index % 3) + [2] * index for index in range(7)]
    writer = LlamaCppBatchWriter(gguf, slots=3, sequence_tokens=64, threads=1)
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
