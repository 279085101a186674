"""The distill batch writer (`tandem distill`'s reply data on llama.cpp) with llama.cpp's
flash attention (its own default) and with the plain kernel the runtime uses on the CPU.

The demo target as F16 (what distill writes replies with), 64 slots of 384 tokens, 96
synthetic prompts of ~70 tokens, replies of up to 160 tokens at T = 0.7; each setting twice,
alternating.

  .venv/bin/python docs/bench/distill_batch_attention.py
"""
import time
from unittest import mock
import torch
from engine.demo_model import demo_gguf_path
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp_batch import LlamaCppSequenceBatch
from engine.tools.distill.replies import Job
from engine.tools.distill.writer import BatchReplyWriter

api = llamacpp_library.library()
gguf = llamacpp_library.quantised_copy(demo_gguf_path(), "fp16")
defaults = api.llama_context_default_params
def run(flash: int, jobs_count=96, slots=64):
    def params():
        p = defaults(); p.flash_attn_type = flash; return p
    with mock.patch.object(api, "llama_context_default_params", params):
        writer = BatchReplyWriter(LlamaCppSequenceBatch(gguf, slots, 384))
    jobs = [Job(i, [1, 9690, 198] + [(i * 131 + t * 7919) % 40000 + 100 for t in range(60)] + [2, 198, 1, 520, 9531, 198], torch.Generator().manual_seed(i)) for i in range(jobs_count)]
    started = time.perf_counter(); tokens = 0
    for reply in writer.write(jobs, 160, 0.7, 32, frozenset([2])):
        tokens += len(reply.token_ids) if hasattr(reply, "token_ids") else len(reply.reply_ids)
    seconds = time.perf_counter() - started
    writer.close()
    return tokens, seconds
for flash, name in ((api.LLAMA_FLASH_ATTN_TYPE_AUTO, "flash (auto)"), (api.LLAMA_FLASH_ATTN_TYPE_DISABLED, "plain"), (api.LLAMA_FLASH_ATTN_TYPE_AUTO, "flash (auto)"), (api.LLAMA_FLASH_ATTN_TYPE_DISABLED, "plain")):
    tokens, seconds = run(flash)
    print(f"{name}: {tokens} reply tokens in {seconds:.1f} s = {tokens / seconds:.0f} tokens/s", flush=True)
