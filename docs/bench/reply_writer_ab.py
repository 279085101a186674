"""Distillation's reply writing before and after the one writer over `SequenceBatch` (issue
46, item 5): the same jobs on the demo target (the shipped distillation prompts), reply
tokens/s, and every reply's ids, top ids and stored log-probs saved as JSON, so that two
checkouts' replies can be compared bit for bit. Runs in a checkout from before the change
(the three writers of engine/tools/distill/) or after it (writer.BatchReplyWriter).

    PYTHONPATH=. .venv/bin/python docs/bench/reply_writer_ab.py KIND:SLOTS LABEL JOBS NEW_TOKENS TEMPERATURE OUT_DIR

KIND: native, llamacpp (F16 copy of the demo GGUF, one thread: two threads spin-wait on a
busy 2-core machine and vary 10x from run to run) or torch (the chat-placed model's torch
forward). Writes OUT_DIR/LABEL-KIND-SLOTS-TEMPERATURE.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from engine.chat_prompt import Message, encode_conversation
from engine.config import ModelSpec
from engine.models import runtime_gguf
from engine.prompts import DISTILL_PROMPTS, read_prompts
from engine.runtime import llamacpp_library
from engine.tools.distill.data import stop_token_ids
from engine.tools.distill.pipeline import MAX_PROMPT_TOKENS, _chat_placed
from engine.tools.distill.replies import Job


def writer_for(kind: str, target, slots: int, sequence_tokens: int):
    gguf = lambda: llamacpp_library.quantised_copy(runtime_gguf(ModelSpec("demo-target"), "auto"), "fp16")  # noqa: E731
    try:  # before: a writer per runtime
        from engine.tools.distill.data import TorchBatchWriter
        from engine.tools.distill.llamacpp_batch import LlamaCppBatchWriter
        from engine.tools.distill.native_batch import NativeBatchWriter
    except ImportError:  # after: the one writer over the runtime's sequence batch
        from engine.runtime.llamacpp_batch import LlamaCppSequenceBatch
        from engine.tools.distill.writer import BatchReplyWriter, native_batch, torch_batch

        if kind == "torch":
            return BatchReplyWriter(torch_batch(target, slots))
        if kind == "native":
            return BatchReplyWriter(native_batch(target, slots, sequence_tokens))
        return BatchReplyWriter(LlamaCppSequenceBatch(gguf(), slots, sequence_tokens, threads=1))
    if kind == "torch":
        return TorchBatchWriter(target, slots)
    if kind == "native":
        return NativeBatchWriter(target, slots, sequence_tokens)
    return LlamaCppBatchWriter(gguf(), slots, sequence_tokens, threads=1)


def main(which: str, label: str, jobs_count: int, new_tokens: int, temperature: float, out_dir: Path) -> None:
    kind, slots = which.split(":")
    target = _chat_placed("demo-target")
    encoded = [encode_conversation(target.tokenizer, [Message("user", prompt)]) for prompt in read_prompts(DISTILL_PROMPTS)]
    encoded = [ids for ids in encoded if len(ids) <= MAX_PROMPT_TOKENS][:jobs_count]
    writer = writer_for(kind, target, int(slots), MAX_PROMPT_TOKENS + new_tokens)
    jobs = [Job(key, ids, torch.Generator().manual_seed(key)) for key, ids in enumerate(encoded)]
    started, cpu_started = time.perf_counter(), time.process_time()
    replies = list(writer.write(jobs, new_tokens, temperature, 32, stop_token_ids(target)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    writer.close()
    tokens = sum(len(reply.reply_ids) for reply in replies)
    print(f"{label} {which} T={temperature} {len(jobs)} jobs: {tokens} reply tokens in {seconds:.1f} s "
          f"(CPU {cpu:.1f} s): {tokens / seconds:.1f} tokens/s", flush=True)
    saved = {reply.key: [reply.reply_ids, reply.top_ids.tolist(), reply.top_logprobs.float().tolist()] for reply in replies}
    (out_dir / f"{label}-{kind}-{slots}-{temperature}.json").write_text(json.dumps(saved))


if __name__ == "__main__":
    which, label, jobs_count, new_tokens, temperature, out_dir = sys.argv[1:7]
    main(which, label, int(jobs_count), int(new_tokens), float(temperature), Path(out_dir))
