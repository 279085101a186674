"""Tiny randomly initialised Llama models, built in the test: no downloads, milliseconds a forward."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.config import ModelSpec, PairConfig
from engine.kv import CachedModel
from engine.models import LoadedModel
from engine.session import LoadedPair

WORDS = [f"w{i}" for i in range(60)]  # with 4 special tokens: a 64-token vocabulary
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s>{% endif %}"
)


def tiny_llama(seed: int, vocab_size: int = 64, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    # Random init gives near-uniform logits; sharpen them so greedy choices are clear and
    # sampling tests see distributions far from uniform.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def cached(model) -> CachedModel:
    return CachedModel(model, torch.device("cpu"))


def tiny_word_pair(make_word_tokenizer) -> LoadedPair:
    """A target-only pair over a tiny random Llama and a whole-word tokenizer (WORDS), with no
    stop token: tests stop by budget, or pick their own stop token."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    model = tiny_llama(seed=3, vocab_size=64)
    loaded = LoadedModel(model, tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=96)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny")), loaded, None)
    pair.stop_token_ids = frozenset()
    return pair
