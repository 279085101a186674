"""Losslessness of speculative decoding on tiny random models: greedy `chain` must emit
exactly what `ar` emits, whatever the drafter proposes, and the caches must roll back to
exactly what a fresh recompute gives."""
from __future__ import annotations

import random

import pytest
import torch

from engine.drafters.base import Drafter, NoDrafter
from engine.drafters.model_drafter import ModelDrafter
from engine.drafters.ngram import NgramDrafter
from engine.sampling import Sampler
from tests.engine.tiny_models import cached, run_round, tiny_llama

VOCAB = 64


def decode(target_model, drafter: Drafter, prompt: list[int], new_tokens: int, sampler: Sampler):
    """Run rounds until `new_tokens` tokens; returns (tokens, outcomes, target runner)."""
    target = cached(target_model)
    context = list(prompt)
    outcomes = []
    while len(context) - len(prompt) < new_tokens:
        outcome = run_round(target, drafter, context, sampler)
        outcomes.append(outcome)
        context += outcome.tokens
    return context[len(prompt) : len(prompt) + new_tokens], outcomes, target


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(seed=0, vocab_size=VOCAB)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_chain_equals_ar_with_random_draft(target_model, seed, k):
    rng = random.Random(seed)
    prompt = random_prompt(rng, rng.randint(1, 40))
    greedy = Sampler()
    expected, _, _ = decode(target_model, NoDrafter(), prompt, 30, greedy)
    wrong_draft = ModelDrafter(cached(tiny_llama(seed=100 + seed, vocab_size=VOCAB)), VOCAB, k)
    actual, outcomes, _ = decode(target_model, wrong_draft, prompt, 30, greedy)
    assert actual == expected
    accepted = sum(o.accepted for o in outcomes)
    proposed = sum(o.proposed for o in outcomes)
    assert accepted < proposed  # the random draft really was wrong most of the time


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_chain_equals_ar_with_perfect_draft(target_model, seed, k):
    rng = random.Random(seed)
    prompt = random_prompt(rng, rng.randint(1, 40))
    greedy = Sampler()
    expected, _, _ = decode(target_model, NoDrafter(), prompt, 30, greedy)
    perfect_draft = ModelDrafter(cached(target_model), VOCAB, k)  # the target drafting for itself
    actual, outcomes, _ = decode(target_model, perfect_draft, prompt, 30, greedy)
    assert actual == expected
    assert all(o.accepted == o.proposed == k for o in outcomes)
    assert len(outcomes) == -(-30 // (k + 1))  # every round yields k + 1 tokens


@pytest.mark.parametrize("seed", range(4))
def test_greedy_chain_equals_ar_with_ngram_draft(target_model, seed):
    rng = random.Random(seed)
    prompt = random_prompt(rng, 12) * 3  # repetition gives the lookup something to find
    greedy = Sampler()
    expected, _, _ = decode(target_model, NoDrafter(), prompt, 40, greedy)
    actual, outcomes, _ = decode(target_model, NgramDrafter(4), prompt, 40, greedy)
    assert actual == expected
    assert sum(o.proposed for o in outcomes) > 0


@pytest.mark.parametrize("seed", range(3))
def test_caches_after_many_rounds_equal_fresh_recompute(target_model, seed):
    rng = random.Random(seed)
    prompt = random_prompt(rng, 10)
    draft_runner = cached(tiny_llama(seed=200 + seed, vocab_size=VOCAB))
    sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(seed))
    tokens, outcomes, target = decode(target_model, ModelDrafter(draft_runner, VOCAB, 4), prompt, 60, sampler)
    # Random acceptance patterns: some rounds rejected early, some accepted in full.
    assert len({o.accepted for o in outcomes}) > 1
    context = prompt + [t for o in outcomes for t in o.tokens]
    for runner, model in ((target, target_model), (draft_runner, draft_runner.model)):
        incremental = runner.logits_for(context)[-1]
        with torch.inference_mode():
            fresh = model(input_ids=torch.tensor([context])).logits[0, -1].float()
        torch.testing.assert_close(incremental, fresh, atol=1e-4, rtol=1e-4)


def test_cache_reuses_shared_prefix_across_turns(target_model):
    runner = cached(target_model)
    first_turn = list(range(20))
    runner.logits_for(first_turn)
    second_turn = first_turn[:15] + [40, 41, 42]
    assert runner.pending(second_turn) == [40, 41, 42]
    assert len(runner) == 15


def test_pending_always_leaves_the_last_token(target_model):
    runner = cached(target_model)
    runner.logits_for(list(range(10)) + [11])
    assert runner.pending(list(range(10))) == [9]  # logits after token 9 are what's needed


def test_ngram_drafter_continues_latest_match():
    drafter = NgramDrafter(3, max_ngram=2)
    context = [1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2]
    assert drafter.propose(context, 10, Sampler()).tokens == [4, 5, 6]
    assert drafter.propose(context, 2, Sampler()).tokens == [4, 5]  # no deeper than the room left
    assert drafter.propose([1, 2, 3], 10, Sampler()).tokens == []
