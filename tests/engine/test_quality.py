"""The quality figures `tandem bench` reports beside the speed of an approximate method."""
import math

import pytest
import torch

from engine.tools.quality import lcs_length, rouge_l_f1, target_nll
from tests.engine.tiny_models import cached, tiny_gguf, tiny_llama


@pytest.mark.parametrize(
    "first, second, expected",
    [([], [], 0), ([1, 2, 3], [], 0), ([1, 2, 3, 4], [1, 3, 4], 3), ([1, 2, 3], [3, 2, 1], 1), ([5, 1, 5, 2], [1, 5, 2, 5], 3)],
)
def test_lcs_length(first, second, expected):
    assert lcs_length(first, second) == expected == lcs_length(second, first)


def test_rouge_l_f1():
    assert rouge_l_f1([1, 2, 3], [1, 2, 3]) == 1.0
    assert rouge_l_f1([], []) == 1.0
    assert rouge_l_f1([1, 2], []) == 0.0 and rouge_l_f1([], [1]) == 0.0
    assert rouge_l_f1([7, 8], [1, 2]) == 0.0
    # LCS 3 of a 4-token candidate and a 6-token reference: P = 3/4, R = 1/2, F1 = 0.6
    assert rouge_l_f1([1, 2, 3, 9], [1, 5, 2, 6, 3, 7]) == pytest.approx(0.6)


def hand_computed_nll(model, prompt: list[int], output: list[int]) -> float:
    """Minus the log-probability of each output token after what precedes it, summed."""
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].float(), dim=-1)
    return -sum(float(log_probs[len(prompt) - 1 + i, token]) for i, token in enumerate(output))


def test_target_nll_is_the_hand_computed_log_likelihood():
    model = tiny_llama(seed=2)
    prompt, output = [3, 9, 4], [7, 1, 12]
    expected = hand_computed_nll(model, prompt, output)
    runtime = cached(model)
    runtime.forward([1, 2])  # whatever the cache held before does not matter, and is gone after
    total, count = target_nll(runtime, prompt, output)
    assert count == 3 and total == pytest.approx(expected, rel=1e-4)
    assert len(runtime) == 0
    assert target_nll(runtime, prompt, []) == (0.0, 0)
    assert math.isfinite(total)


def test_target_nll_on_llamacpp_is_the_same_log_likelihood(tmp_path):
    """The demo target runs on llama.cpp by default: its logits give the same NLL."""
    pytest.importorskip("llama_cpp")
    from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

    model = tiny_llama(seed=2, vocab_size=64)
    weights = load_weights(tiny_gguf(model, tmp_path / "target"), use_gpu=False)
    try:
        runtime = LlamaCppRuntime(weights, 64, threads=1)
        prompt, output = [3, 9, 4, 20], [7, 1, 12, 40, 5, 5, 61, 2]
        total, count = target_nll(runtime, prompt, output)
        assert count == len(output) and total == pytest.approx(hand_computed_nll(model, prompt, output), rel=1e-3)
        assert len(runtime) == 0
        runtime.close()
    finally:
        weights.close()
