"""`--size prefix` drafts (issue 12): the target cut after its first layers, trained on from its
own weights. Before training, such a draft must compute exactly the target's state after those
layers (through the target's final norm and output layer), on the full or a reduced vocabulary."""
from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from engine.config import ConfigError
from engine.tools.distill.model import build_prefix_draft, prefix_shape
from engine.runtime.reduced_vocabulary import ReducedVocabulary
from tests.engine.tiny_models import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=11, vocab_size=64, layers=3, hidden=32).eval()


def target_logits_after(target, layers: int, input_ids: torch.Tensor) -> torch.Tensor:
    """What the target would predict if it stopped after `layers` layers."""
    hidden = target.model(input_ids=input_ids, output_hidden_states=True).hidden_states[layers]
    return target.lm_head(target.model.norm(hidden))


@pytest.mark.parametrize("layers", [1, 2])
@torch.inference_mode()
def test_an_untrained_prefix_draft_is_the_target_cut_after_its_first_layers(target, layers):
    draft = build_prefix_draft(target, layers).eval()
    input_ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(layers))
    assert draft.config.num_hidden_layers == layers
    torch.testing.assert_close(draft(input_ids=input_ids).logits, target_logits_after(target, layers, input_ids))
    # and it is a copy: training the draft leaves the target alone
    assert draft.model.layers[0].mlp.up_proj.weight.data_ptr() != target.model.layers[0].mlp.up_proj.weight.data_ptr()


@torch.inference_mode()
def test_a_reduced_prefix_draft_keeps_the_kept_tokens_logits(target):
    kept = (3, 7, 8, 20, 41, 63)
    vocabulary = ReducedVocabulary(kept_ids=kept, full_size=64)
    draft = build_prefix_draft(target, 2, vocabulary).eval()
    full_ids = torch.tensor([[3, 20, 20, 63, 7]])
    expected = target_logits_after(target, 2, full_ids)[..., list(kept)]
    logits = draft(input_ids=vocabulary.to_model_ids(full_ids)).logits
    assert logits.shape[-1] == len(kept) + 1  # and the shared row for every other token
    torch.testing.assert_close(logits[..., : len(kept)], expected)


def test_a_prefix_must_leave_out_at_least_one_layer_and_keep_one(target):
    assert prefix_shape(target.config, 2).hidden_size == target.config.hidden_size
    for layers in (0, 3, 4):
        with pytest.raises(ConfigError, match="1 to 2 of the target's layers"):
            prefix_shape(target.config, layers)


def test_a_prefix_is_cut_from_llama_targets_only():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2))
    with pytest.raises(ConfigError, match="Llama-architecture"):
        build_prefix_draft(gpt2, 1)
