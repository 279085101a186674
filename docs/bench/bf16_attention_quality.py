"""What bf16 attention would cost the demo target's predictions (issue 45, item 5).

A 7,000-token prompt's attention on the native forward runs at ~90% of this CPU's float32
multiply-add peak; AVX-512 BF16's dot products do twice the multiply-adds an instruction. Before
building that, this measures the price: the demo target over a long text, once as it is and once
with its attention's queries, keys, values and softmax weights rounded to bfloat16 (sums still in
float32, as VDPBF16PS keeps them). Printed: NLL per token of both, their top-1 agreement, and the
KL divergence of the rounded model's next-token distributions from the original's.

Runs the torch forward (TANDEM_INT8_KERNEL=off: the native forward would not call torch's
attention), int8 weights as the app loads them:

    TANDEM_INT8_KERNEL=off .venv/bin/python docs/bench/bf16_attention_quality.py [TOKENS]

Built since (the AVX-512 BF16 kernel build): `--builds` compares the native forward itself, the
AVX-512 VNNI build (float32 attention) against the AVX-512 BF16 one, each over its own loaded
target (a CPU with AVX-512 BF16 only):

    .venv/bin/python docs/bench/bf16_attention_quality.py --builds [TOKENS]
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.pairs import find_pair
from engine.runtime import int8_kernel, static_cache_forward
from engine.session import load_pair

REPOSITORY = Path(__file__).resolve().parents[2]


def rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def bf16_attend(query, keys, values, mask, scale, cap=None):
    """static_cache_forward._attend's result with q, k, v and the softmax weights in bfloat16."""
    heads, count = query.shape[1], query.shape[2]
    groups = heads // keys.shape[1]
    keys, values = rounded(keys).repeat_interleave(groups, dim=1), rounded(values).repeat_interleave(groups, dim=1)
    scores = rounded(query) @ keys.transpose(2, 3) * scale
    if mask is not None:
        scores = scores + mask[0, 0, :count]  # the first group's rows: every group sees the same
    return rounded(F.softmax(scores, dim=-1)) @ values


def load_target(build: str | None):
    """The demo pair with no draft, its target on `build` of the kernel (None: as the
    environment says)."""
    if build is not None:
        for name, fresh in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
            setattr(int8_kernel, name, fresh)
        os.environ["TANDEM_INT8_KERNEL"] = build
    return load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)


def read(target, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Every position's logits over `ids`, and the NLL per token of the text."""
    target.reset()
    logits = target.forward(ids, logits_wanted=len(ids)).float()
    surprise = -torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
    return logits, surprise.mean().item()


def main() -> None:
    builds = "--builds" in sys.argv
    numbers = [argument for argument in sys.argv[1:] if argument != "--builds"]
    count = int(numbers[0]) if numbers else 1500
    pair = load_target("AVX-512 VNNI" if builds else None)
    target = pair.target_runner
    text = "".join((REPOSITORY / name).read_text() for name in ("README.md", "docs/USAGE.md", "packaging/README.md"))
    ids = pair.tokenizer.encode(text)[:count]
    print(f"runtime: {target.name} ({int8_kernel.variant_name()}); {len(ids)} tokens of the project's README, USAGE and "
          "packaging README")
    original, original_nll = read(target, ids)
    if builds:
        pair.close()
        pair = load_target("AVX-512 BF16")
        print(f"against: {pair.target_runner.name} ({int8_kernel.variant_name()})")
        changed, changed_nll = read(pair.target_runner, ids)
    else:
        static_cache_forward._attend = bf16_attend
        changed, changed_nll = read(target, ids)
    log_original, log_changed = torch.log_softmax(original, -1), torch.log_softmax(changed, -1)
    divergence = (log_original.exp() * (log_original - log_changed)).sum(-1)
    agreement = (original.argmax(-1) == changed.argmax(-1)).float().mean().item()
    print(f"NLL per token: float32 {original_nll:.4f}, bf16 attention {changed_nll:.4f}; top-1 agreement {agreement:.4f}; "
          f"KL mean {divergence.mean():.2e}, max {divergence.max():.2e} nats")
    pair.close()


if __name__ == "__main__":
    main()
