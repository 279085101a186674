"""How close 8-bit versions of the demo target stay to its float32 self (issue 21).

Greedy float32 replies (96 new tokens) to the first 12 shipped chat prompts are read back,
teacher-forced, by each variant; printed: the share of positions whose most likely next token
is the float32 model's, and the mean KL(float32 || variant) per position.

  .venv/bin/python docs/bench/int8_quality.py

Variants: int8 weights with float32 activations (a float matmul over the int8 rows); the
same weights with the activations rounded to int8 once per token; rounded in two levels, as
`Int8Linear` does on the CPU; int4-wo (int4_weights.py: 4-bit weights per group of 32, the
activations rounded once per group); and bf16 for scale. (The demo target's own weights come
from a Q4_1 file: 4-bit already, in groups of 32 with a minimum each, so int4-wo rounds them a
second time, onto other levels.)
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import DEMO_TARGET, ModelSpec
from engine.models import load_model
from engine.runtime import int8_weights
from engine.runtime.int8_weights import quantise_weight_only

PROMPTS = Path(__file__).resolve().parents[2] / "resources" / "prompts" / "chat_prompts.jsonl"


def float_activations(layer, x):
    out = F.linear(x.float(), layer.weight.float()) * layer.scale
    return (out if layer.bias is None else out + layer.bias).to(x.dtype)


def one_level(layer, x):
    rows = x.reshape(-1, x.shape[-1]).float()
    scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    sums = torch._int_mm(torch.round(rows / scale).to(torch.int8), layer.weight.t()).float()
    out = (sums * scale * layer.scale).reshape(*x.shape[:-1], -1)
    return (out if layer.bias is None else out + layer.bias).to(x.dtype)


def main() -> None:
    torch.set_num_threads(2)
    loaded = load_model(ModelSpec(DEMO_TARGET, precision="fp32", device="cpu"), runtime="torch")
    reference, tokenizer = loaded.model, loaded.tokenizer
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()][:12]
    with torch.no_grad():
        sequences = []
        for prompt in prompts:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
            sequences.append(reference.generate(ids, max_new_tokens=96, do_sample=False))
        expected = [reference(sequence).logits[0] for sequence in sequences]

    def report(name: str, model: torch.nn.Module) -> None:
        with torch.no_grad():
            got = [model(sequence).logits[0].float() for sequence in sequences]
        positions = sum(logits.shape[0] for logits in expected)
        agree = sum((a.argmax(-1) == b.argmax(-1)).sum().item() for a, b in zip(expected, got))
        kl = sum(F.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="sum").item() for a, b in zip(expected, got))
        print(f"{name:40s} top-1 agreement {agree / positions:.4f}   mean KL {kl / positions:.5f}   ({positions} positions)")

    quantised = quantise_weight_only(copy.deepcopy(reference))
    shipped = int8_weights.Int8Linear.forward
    for name, forward in (("int8 weights, float32 activations", float_activations), ("int8 weights, activations in one level", one_level), ("int8 weights, activations in two levels", shipped)):
        int8_weights.Int8Linear.forward = forward
        report(name, quantised)
    int8_weights.Int8Linear.forward = shipped
    report("int4-wo (4-bit weights, groups of 32)", quantise_weight_only(copy.deepcopy(reference), bits=4))
    report("bf16", copy.deepcopy(reference).to(torch.bfloat16))


if __name__ == "__main__":
    main()
