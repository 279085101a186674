"""Reply tokens per second of the distillation's batch writers on the demo target: the native
int8 forward at several slot counts against llama.cpp's continuous batching (F16, the writer
`tandem distill` used before), on the same jobs (the run's own prompts, T = 0.7, up to 256 new
tokens), one after another in one process.

    PYTHONPATH=. .venv/bin/python docs/bench/reply_writers.py [JOBS] [SLOTS ...]
"""
from __future__ import annotations

import sys
import time

import torch

from engine.chat_prompt import Message, encode_conversation
from engine.config import ModelSpec
from engine.models import runtime_gguf
from engine.prompts import DISTILL_PROMPTS, read_prompts
from engine.runtime import llamacpp_library
from engine.tools.distill.data import stop_token_ids
from engine.runtime.llamacpp_batch import LlamaCppSequenceBatch
from engine.tools.distill.pipeline import MAX_PROMPT_TOKENS, _chat_placed
from engine.tools.distill.replies import Job
from engine.tools.distill.writer import BatchReplyWriter, native_batch

NEW_TOKENS, TEMPERATURE, TOP_K = 256, 0.7, 32


def main(jobs_count: int, slot_counts: list[int]) -> None:
    target = _chat_placed("demo-target")
    prompts = read_prompts(DISTILL_PROMPTS)
    encoded = [encode_conversation(target.tokenizer, [Message("user", prompt)]) for prompt in prompts]
    encoded = [ids for ids in encoded if len(ids) <= MAX_PROMPT_TOKENS][:jobs_count]
    stops = stop_token_ids(target)
    print(f"{len(encoded)} jobs, prompts of {sum(map(len, encoded)) / len(encoded):.0f} tokens on average, "
          f"up to {NEW_TOKENS} new tokens, T = {TEMPERATURE}, {torch.get_num_threads()} threads")

    def run(name, writer):
        jobs = [Job(key, ids, torch.Generator().manual_seed(key)) for key, ids in enumerate(encoded)]
        start = time.perf_counter()
        tokens = sum(len(reply.reply_ids) for reply in writer.write(jobs, NEW_TOKENS, TEMPERATURE, TOP_K, stops))
        seconds = time.perf_counter() - start
        writer.close()
        print(f"{name:28s} {tokens:7d} reply tokens in {seconds:6.1f} s: {tokens / seconds:7.1f} tokens/s", flush=True)
        return tokens / seconds

    rates = {}
    for slots in slot_counts:
        rates[f"native, {slots} slots"] = run(f"native, {slots} slots", BatchReplyWriter(native_batch(target, slots, MAX_PROMPT_TOKENS + NEW_TOKENS)))
    gguf = llamacpp_library.quantised_copy(runtime_gguf(ModelSpec("demo-target"), "auto"), "fp16")
    rates["llama.cpp F16, 128 slots"] = run("llama.cpp F16, 128 slots", BatchReplyWriter(LlamaCppSequenceBatch(gguf, 128, MAX_PROMPT_TOKENS + NEW_TOKENS)))
    baseline = rates["llama.cpp F16, 128 slots"]
    for name, rate in rates.items():
        print(f"{name:28s} {rate / baseline:5.2f}x llama.cpp's")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64, [int(value) for value in sys.argv[2:]] or [32, 64, 128])
