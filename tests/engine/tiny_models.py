"""Tiny randomly initialised Llama models, built in the test: no downloads, milliseconds a forward."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.config import ModelSpec, PairConfig
from engine.models import LoadedModel
from engine.runtime.torch_eager import TorchRuntime
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


def cached(model) -> TorchRuntime:
    return TorchRuntime(model, torch.device("cpu"))


def run_round(target, drafter, context: list[int], sampler=None, verify=None):
    """One speculative round as a reply plays it, with room to spare in the context."""
    from engine.round import play_round
    from engine.sampling import Sampler
    from engine.verifying.exact import exact_verifier

    return play_round(target, drafter, verify or exact_verifier(), context, 10**6, sampler or Sampler())


def tiny_gguf(model: LlamaForCausalLM, folder, precision: str = "f32"):
    """`model` saved to `folder` with a small byte-level BPE tokenizer covering its
    vocabulary, and exported as GGUF for the llama.cpp runtime; returns the GGUF path."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from engine.tools.export_gguf import export_gguf

    vocab_size = model.config.vocab_size
    # llama.cpp refuses a BPE vocabulary without merges: keep room for at least one.
    letters = [chr(ord("a") + i) for i in range(min(20, vocab_size - 3))]
    pairs = [(a, b) for a in letters[:6] for b in letters[:7]][: vocab_size - 2 - len(letters)]
    words = letters + [a + b for a, b in pairs]
    vocabulary = {word: i for i, word in enumerate(words)} | {"<s>": vocab_size - 2, "</s>": vocab_size - 1}
    backend = Tokenizer(models.BPE(vocabulary, pairs, unk_token=None))
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return export_gguf(folder, precision=precision)


def tiny_word_pair(make_word_tokenizer) -> LoadedPair:
    """A target-only pair over a tiny random Llama and a whole-word tokenizer (WORDS), with no
    stop token: tests stop by budget, or pick their own stop token."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    model = tiny_llama(seed=3, vocab_size=64)
    loaded = LoadedModel(model, tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=96)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny")), loaded, None)
    pair.stop_token_ids = frozenset()
    return pair
