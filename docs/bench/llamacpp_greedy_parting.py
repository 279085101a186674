"""Where greedy `chain` and `tree` replies part from `ar`'s on llama.cpp, and by how much: for
each held-out prompt (the bench's shipped chat prompts), the first reply token that differs,
and there the target's top-2 logit gap in `ar`'s single-token step and in the call that decided
the speculative reply, and the largest logit difference between those two rows.

  .venv/bin/python docs/bench/llamacpp_greedy_parting.py [METHODS] [PROMPTS]
  ATTENTION=plain-f16 .venv/bin/python docs/bench/llamacpp_greedy_parting.py chain,tree 10

ATTENTION=plain-f16|flash-f16|flash-q8_0 opens the contexts with that attention instead of
the runtime's own (`llamacpp_context.verifying_attention`). The demo pair, 256 new tokens, T = 0.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from engine.chat_prompt import Message
from engine.config import DecodeSettings, demo_pair
from engine.prompts import CHAT_PROMPTS, read_prompts
from engine.runtime import llamacpp_context, llamacpp_library
from engine.session import load_pair

ATTENTION = {"plain-f16": (False, "F16"), "flash-f16": (True, "F16"), "flash-q8_0": (True, "Q8_0")}

calls = []  # (context, positions, ids, logits rows of the last len(rows) ids), of every decode


def record_calls() -> None:
    run = llamacpp_context.LlamaCppContext.run

    def recording_run(self, new_ids, parents, positions, logits_wanted, *args, **kwargs):
        outputs = run(self, new_ids, parents, positions, logits_wanted, *args, **kwargs)
        calls.append((id(self), list(positions), list(new_ids), outputs.logits.copy()))
        return outputs

    llamacpp_context.LlamaCppContext.run = recording_run


def use_attention(name: str) -> None:
    api = llamacpp_library.library()
    flash, cache = ATTENTION[name]
    kernel = api.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else api.LLAMA_FLASH_ATTN_TYPE_DISABLED
    chosen = llamacpp_context.Attention(kernel, getattr(api, f"GGML_TYPE_{cache}"))
    llamacpp_context.verifying_attention = lambda _weights: chosen


def deciding_row(target_calls, position: int, token: int):
    """The logits of the last target call that ran `token` at `position`, and its size."""
    for _, positions, ids, logits in reversed(target_calls):
        first = len(ids) - len(logits)
        for index in range(first, len(ids)):
            if positions[index] == position and ids[index] == token:
                return logits[index - first], len(ids)
    return None, None


def top2_gap(row) -> float | None:
    if row is None:
        return None
    second, first = np.sort(row)[-2:]
    return float(first - second)


def main() -> None:
    methods = sys.argv[1].split(",") if len(sys.argv) > 1 else ["chain", "tree"]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    if os.environ.get("ATTENTION"):
        use_attention(os.environ["ATTENTION"])
    record_calls()
    pair = load_pair(dataclasses.replace(demo_pair(), runtime="llama.cpp"))
    target = id(pair.target_runner._context)

    def reply(method: str, prompt: str):
        calls.clear()
        settings = DecodeSettings(method=method, max_new_tokens=256, temperature=0.0)
        ids = list(list(pair.generate([Message("user", prompt)], settings))[-1].token_ids)
        return ids, [call for call in calls if call[0] == target]

    report = []
    for index, prompt in enumerate(read_prompts(CHAT_PROMPTS)[:limit]):
        ar_ids, ar_calls = reply("ar", prompt)
        prompt_end = max(p for call in ar_calls if len(call[2]) > 1 for p in call[1])  # the prompt's last position
        for method in methods:
            ids, method_calls = reply(method, prompt)
            entry = {"prompt": index, "method": method, "equal": ids == ar_ids}
            if not entry["equal"]:
                at = next((i for i, (a, b) in enumerate(zip(ar_ids, ids)) if a != b), min(len(ar_ids), len(ids)))
                step, verify, size = None, None, None
                if at > 0:  # the row that chose reply token `at` follows reply token at - 1
                    step, _ = deciding_row(ar_calls, prompt_end + at, ar_ids[at - 1])
                    verify, size = deciding_row(method_calls, prompt_end + at, ar_ids[at - 1])
                entry.update({
                    "first_differing_reply_token": at, "step_top2_gap": top2_gap(step), "verify_top2_gap": top2_gap(verify),
                    "deciding_call_tokens": size,
                    "largest_logit_difference": float(np.abs(step - verify).max()) if step is not None and verify is not None else None,
                })
            report.append(entry)
            print(json.dumps(entry), flush=True)
    pair.close()
    for method in methods:
        rows = [row for row in report if row["method"] == method]
        print(f"{method}: equal to ar in {sum(row['equal'] for row in rows)} of {len(rows)}")


if __name__ == "__main__":
    main()
