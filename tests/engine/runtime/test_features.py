"""A runtime opened with feature layers keeps, per cached slot, the residual stream entering
those layers (what an EAGLE-3 head drafts from): the same numbers on every runtime, through
chains, trees and kept paths."""
from __future__ import annotations

import random

import pytest
import torch

from engine.runtime.torch_eager import TorchRuntime
from engine.runtime.torch_static import StaticTorchRuntime

from ..tiny_models import tiny_gguf, tiny_llama

LAYERS = (0, 1, 3)  # layer inputs: 0 is the embeddings


def reference_features(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), F) from one plain causal forward over `ids`."""
    with torch.inference_mode():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([states[layer][0] for layer in LAYERS], dim=-1).float()


def exercise(runtime, rng: random.Random) -> list[int]:
    """A prompt in two pieces, then rounds of trees whose random paths are kept."""
    runtime.forward([1, 2, 3, 4, 5])
    runtime.forward([6, 7, 8])
    for _ in range(6):
        start = len(runtime)
        tokens, parents = [], []
        for index in range(rng.randint(1, 6)):
            parents.append(rng.choice([start - 1] + [start + j for j in range(index)]))
            tokens.append(rng.randrange(40))
        runtime.forward_tree(tokens, parents, logits_wanted=len(tokens))
        leaf = start + rng.randrange(len(tokens))
        last_chain_slot, branch = runtime.ancestors(leaf)
        runtime.keep_slots(last_chain_slot + 1, sorted(branch))
    return runtime.cached_ids


def tiny_model():
    return tiny_llama(seed=3, layers=4, vocab_size=48)


@pytest.mark.parametrize("seed", range(3))
def test_torch_features_follow_the_kept_context(seed):
    model = tiny_model()
    runtime = TorchRuntime(model, torch.device("cpu"), feature_layers=LAYERS)
    ids = exercise(runtime, random.Random(seed))
    torch.testing.assert_close(runtime.features, reference_features(model, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", range(2))
def test_static_cache_features_equal_the_eager_ones(seed):
    model = tiny_model()
    runtime = StaticTorchRuntime(model, torch.device("cpu"), capacity=128, graphs=False, feature_layers=LAYERS)
    ids = exercise(runtime, random.Random(seed))
    torch.testing.assert_close(runtime.features, reference_features(model, ids), atol=1e-4, rtol=1e-4)


def test_llamacpp_features_equal_torch_ones(tmp_path):
    pytest.importorskip("llama_cpp")
    from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

    model = tiny_model()
    weights = load_weights(tiny_gguf(model, tmp_path / "tiny"), use_gpu=False)
    runtime = LlamaCppRuntime(weights, 128, threads=1, feature_layers=LAYERS)
    try:
        ids = exercise(runtime, random.Random(5))
        torch.testing.assert_close(runtime.features, reference_features(model, ids), atol=2e-3, rtol=2e-3)
    finally:
        runtime.close()
        weights.close()


def test_a_runtime_without_feature_layers_says_so():
    runtime = TorchRuntime(tiny_model(), torch.device("cpu"))
    runtime.forward([1, 2])
    with pytest.raises(ValueError, match="without feature layers"):
        runtime.features
