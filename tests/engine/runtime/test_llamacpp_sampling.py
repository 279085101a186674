"""Sampling exactness on the llama.cpp runtime: tiny random Llamas exported to GGUF in the
test, sampled chains and trees whose first two tokens must follow the target's own
distribution; a biased tree verifier must be caught on this runtime too."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("llama_cpp")

import engine.verifying.exact
from engine.drafters.model_drafter import ModelDrafter
from engine.drafters.tree_drafter import TreeDrafter, TreeShape
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights
from engine.sampling import Sampler
from engine.tree_shape import FixedTreeShape
from tests.engine.test_sampling_pipeline import PROMPT, SAMPLES, VOCAB, chi_square, critical_value, exact_two_token_distribution
from tests.engine.test_tree import biased_per_path_verifier
from tests.engine.tiny_models import run_round, tiny_gguf, tiny_llama


@pytest.fixture(scope="module")
def tiny_pair_on_llamacpp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    target_model = tiny_llama(seed=1, vocab_size=VOCAB)
    target = load_weights(tiny_gguf(target_model, folder / "target"), use_gpu=False)
    draft = load_weights(tiny_gguf(tiny_llama(seed=2, vocab_size=VOCAB), folder / "draft"), use_gpu=False)
    yield target_model, target, draft
    target.close()
    draft.close()


def sample_first_two(tiny_pair_on_llamacpp, one_round, seed: int) -> tuple[Counter, dict]:
    target_model, target_weights, draft_weights = tiny_pair_on_llamacpp
    sampler = Sampler(temperature=1.3, top_k=6, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    target, draft = LlamaCppRuntime(target_weights, 64, threads=1), LlamaCppRuntime(draft_weights, 64, threads=1)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        context = list(PROMPT)
        while len(context) < len(PROMPT) + 2:
            context += one_round(target, draft, context, sampler).tokens
        counts[tuple(context[len(PROMPT) : len(PROMPT) + 2])] += 1
    target.close()
    draft.close()
    # The GGUF is an F32 copy of `target_model`: its distribution is the reference.
    return counts, exact_two_token_distribution(target_model, sampler)


def chain_round(target, draft, context, sampler):
    return run_round(target, ModelDrafter(draft, VOCAB, 2), context, sampler)


def tree_round_of_six(target, draft, context, sampler):
    policy = FixedTreeShape(TreeShape(budget=6, depth=2, branching=3, beam=2))
    return run_round(target, TreeDrafter(draft, VOCAB, policy), context, sampler)


@pytest.mark.parametrize("one_round", [chain_round, tree_round_of_six], ids=["chain", "tree"])
def test_sampled_decoding_on_llamacpp_follows_the_target_distribution(tiny_pair_on_llamacpp, one_round):
    counts, expected = sample_first_two(tiny_pair_on_llamacpp, one_round, seed=11)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic <= critical_value(df), f"chi-square {statistic:.1f} on {df} df"


def test_a_per_path_tree_verifier_is_caught_on_llamacpp(tiny_pair_on_llamacpp, monkeypatch):
    monkeypatch.setattr(engine.verifying.exact, "verify_tree_sampled", biased_per_path_verifier)
    counts, expected = sample_first_two(tiny_pair_on_llamacpp, tree_round_of_six, seed=11)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic > critical_value(df), f"a biased verifier passed: chi-square {statistic:.1f} on {df} df"
