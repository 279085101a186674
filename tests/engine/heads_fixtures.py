"""Tiny pairs with a draft and heads, for the SPRINTER and SpecDec++ tests."""
from __future__ import annotations

import copy

import torch

from engine.config import ModelSpec, PairConfig
from engine.heads.features import EXTRA_FEATURES
from engine.heads.modules import AcceptanceHead, SprinterVerifier
from engine.heads.store import MODES, DraftHeads
from engine.models import LoadedModel
from engine.session import LoadedPair
from tests.engine.tiny_models import TEMPLATE, WORDS, tiny_llama

HIDDEN = 32


def noisy_copy(model, noise: float, seed: int):
    """A draft that agrees with `model` often but not always, more so where it is sure."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * parameter.std())
    return draft


def tiny_draft_pair(make_word_tokenizer, noise: float = 0.3) -> LoadedPair:
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = tiny_llama(seed=3, vocab_size=64, hidden=HIDDEN)
    draft = noisy_copy(target, noise, seed=4)

    def loaded(model, label: str) -> LoadedModel:
        return LoadedModel(model, tokenizer, torch.device("cpu"), torch.float32, "fp32", label, context_length=160)

    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), loaded(target, "tiny"), loaded(draft, "tiny-draft"))
    pair.stop_token_ids = frozenset()
    return pair


def fixed_heads(passes: bool, acceptance_logit: float = 0.0) -> DraftHeads:
    """Heads whose verifier always passes (or always flags) and whose acceptance head always
    predicts sigmoid(acceptance_logit): untrained weights zeroed, biases set."""
    width = HIDDEN + EXTRA_FEATURES
    verifiers, acceptance_heads = {}, {}
    for mode in MODES:
        verifier, head = SprinterVerifier(width), AcceptanceHead(width)
        with torch.no_grad():
            verifier.linear.weight.zero_()
            verifier.linear.bias.fill_(0.0)
            head.logit.weight.zero_()
            head.logit.bias.fill_(acceptance_logit)
        verifiers[mode], acceptance_heads[mode] = verifier.eval(), head.eval()
    threshold = 0.0 if passes else 1.5  # sigmoid(0) = 0.5: >= 0 always, >= 1.5 never
    card = {"feature_width": width, "modes": {mode: {"sprinter": {"threshold": threshold}} for mode in MODES}}
    return DraftHeads(verifiers, acceptance_heads, card)
