"""GGUF export of a Llama folder: llama.cpp must compute what transformers computes."""
from __future__ import annotations

import pytest
import torch

from engine.errors import ModelLoadError
from engine.gguf_export import export_gguf
from tests.engine.tiny_models import tiny_gguf, tiny_llama

VOCAB = 64


@pytest.fixture
def tiny_folder(tmp_path):
    model = tiny_llama(seed=7, vocab_size=VOCAB)
    folder = tmp_path / "tiny"
    tiny_gguf(model, folder).unlink()  # the folder, with its tokenizer; each test exports anew
    return model, folder


@pytest.mark.parametrize("precision, tolerance", [("f32", 1e-3), ("f16", 5e-2)])
def test_llamacpp_runs_the_export_like_transformers(tiny_folder, precision, tolerance):
    pytest.importorskip("llama_cpp")
    from engine.runtime.llamacpp import LlamaCppRuntime, load_weights

    model, folder = tiny_folder
    path = export_gguf(folder, precision=precision)
    weights = load_weights(path, use_gpu=False)
    runtime = LlamaCppRuntime(weights, 128)
    ids = [3, 17, 42, 5, 9, 60, 1, 33]
    logits = runtime.forward(ids, logits_wanted=len(ids))
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0]
    # Every position, so a wrong rotary layout (which moves later positions) is caught.
    assert torch.allclose(logits, expected, atol=tolerance * expected.abs().max()), (logits - expected).abs().max()
    runtime.close()
    weights.close()


def test_a_folder_of_another_architecture_is_refused(tiny_folder):
    _, folder = tiny_folder
    config = (folder / "config.json").read_text().replace('"llama"', '"gpt2"')
    (folder / "config.json").write_text(config)
    with pytest.raises(ModelLoadError, match="Llama architecture only"):
        export_gguf(folder)


def test_unreadable_weights_are_reported_and_leave_no_file(tiny_folder):
    _, folder = tiny_folder
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match="tiny"):
        export_gguf(folder)
    assert not list(folder.glob("*.gguf")) and not list(folder.glob(".*partial*"))
