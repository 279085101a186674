"""A runtime opened with hidden states returns, beside the logits, the final-norm hidden
state the LM head read: learned heads on the draft (SPRINTER, SpecDec++) depend on it."""
import pytest
import torch

from engine.runtime.torch_eager import TorchRuntime

from ..tiny_models import tiny_llama


@torch.no_grad()
def test_torch_hidden_states_are_what_the_lm_head_read():
    model = tiny_llama(seed=1)
    runtime = TorchRuntime(model, torch.device("cpu"), hidden_states=True)
    logits = runtime.forward([1, 2, 3, 4], logits_wanted=2)
    hidden = runtime.last_hidden_states()
    assert hidden.shape == (2, model.config.hidden_size)
    torch.testing.assert_close(model.lm_head(hidden), logits, rtol=1e-5, atol=1e-5)
    logits = runtime.forward_tree([5, 6], [3, 3], logits_wanted=2)  # a branch point
    torch.testing.assert_close(model.lm_head(runtime.last_hidden_states()), logits, rtol=1e-5, atol=1e-5)


def test_a_runtime_without_hidden_states_says_so():
    runtime = TorchRuntime(tiny_llama(seed=1), torch.device("cpu"))
    runtime.forward([1, 2])
    assert not runtime.returns_hidden
    with pytest.raises(ValueError, match="without hidden states"):
        runtime.last_hidden_states()
