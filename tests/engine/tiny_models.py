"""Tiny randomly initialised Llama models, built in the test: no downloads, milliseconds a forward."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.runtime.torch_eager import TorchRuntime


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


def cached(model) -> TorchRuntime:
    return TorchRuntime(model, torch.device("cpu"))
