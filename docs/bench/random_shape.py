"""Build a weight-random model of a real family's shape, with the demo pair's tokenizer, as a
Hugging Face folder that `tandem bench --target FOLDER` loads like any other model.

Why: speculation pays or not by what a step, a verify and a draft call cost at the size
people run (1-8B), which no model shipped here has. Random weights cost what real ones do;
`tandem bench --synthetic-acceptance` supplies what they lack, the drafts' agreement. The demo
tokenizer (SmolLM2's, 49,152 tokens) lets the demo draft and its EAGLE-3 head draft for every
shape; families whose own vocabulary is larger get a smaller LM head here than in real life
(said in the output).

    python docs/bench/random_shape.py smollm2-1.7b OUT_DIR      # ~3.4 GB of bf16 weights

Shapes: the published configs' sizes (hidden, intermediate, layers, heads, key/value heads).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

REPOSITORY = Path(__file__).resolve().parents[2]
DEMO_DRAFT = REPOSITORY / "resources" / "drafts" / "smollm2-135m-draft"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
DEMO_VOCABULARY = 49152

# name: (family, hidden, intermediate, layers, heads, key/value heads, own vocabulary, rope theta)
SHAPES = {
    "smollm2-360m": ("llama", 960, 2560, 32, 15, 5, 49152, 100000.0),
    "smollm2-1.7b": ("llama", 2048, 8192, 24, 32, 32, 49152, 130000.0),
    "llama-3.2-1b": ("llama", 2048, 8192, 16, 32, 8, 128256, 500000.0),
    "llama-3.2-3b": ("llama", 3072, 8192, 28, 24, 8, 128256, 500000.0),
    "qwen2.5-0.5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, 1000000.0),
    "qwen2.5-1.5b": ("qwen2", 1536, 8960, 28, 12, 2, 151936, 1000000.0),
    "qwen2.5-7b": ("qwen2", 3584, 18944, 28, 28, 4, 152064, 1000000.0),
    "llama-3.1-8b": ("llama", 4096, 14336, 32, 32, 8, 128256, 500000.0),
}


def build(name: str, out: Path, seed: int = 0) -> Path:
    family, hidden, intermediate, layers, heads, kv_heads, own_vocabulary, rope_theta = SHAPES[name]
    common = dict(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=DEMO_VOCABULARY, rope_theta=rope_theta, max_position_embeddings=8192,
        tie_word_embeddings=family == "llama" and hidden <= 2048, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
    )
    config = LlamaConfig(**common) if family == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    # Built in bf16 from the start: an 8B shape in float32 (32 GB) would not fit a 24 GiB machine.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cpu"):
        model = (LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM)(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="2GB")
    for file in TOKENIZER_FILES:
        if (DEMO_DRAFT / file).exists():
            shutil.copy(DEMO_DRAFT / file, out / file)
    parameters = sum(p.numel() for p in model.parameters())
    note = "" if own_vocabulary == DEMO_VOCABULARY else f" (its own vocabulary is {own_vocabulary:,}: a larger LM head in real life)"
    print(f"{name}: {parameters / 1e9:.2f}B parameters, weight-random, demo tokenizer{note} -> {out}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: {Path(__file__).name} {{{','.join(SHAPES)}}} OUT_DIR")
    build(sys.argv[1], Path(sys.argv[2]))
