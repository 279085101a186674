"""Loading torch models as the chat and the app do: no third-party progress bars on screen."""
from __future__ import annotations

import threading

import pytest
import torch
import tqdm.auto as tqdm_auto
import tqdm.std as tqdm_std
from tqdm._monitor import TMonitor
from transformers.utils import logging as transformers_logging

from engine.config import ModelSpec
from engine.models import load_model, resolve_source
from tests.engine.tiny_models import WORDS, tiny_gguf, tiny_llama


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, make_word_tokenizer):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(seed=0, vocab_size=64).save_pretrained(folder)
    make_word_tokenizer(WORDS).save_pretrained(folder)
    return folder


def test_loading_weights_draws_no_progress_bar_and_leaves_bars_on_for_scripts(tiny_folder, capsys):
    capsys.readouterr()
    load_model(ModelSpec(str(tiny_folder), precision="fp32", device="cpu"), runtime="torch")
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()


def test_converting_a_gguf_for_torch_draws_no_progress_bar(tmp_path, capsys):
    gguf = tiny_gguf(tiny_llama(seed=2, vocab_size=64), tmp_path / "model")
    capsys.readouterr()
    resolve_source(ModelSpec(str(gguf)))
    assert "it/s]" not in capsys.readouterr().err  # what every tqdm bar ends with


def test_converting_a_gguf_leaves_no_progress_bar_thread_running(tmp_path):
    """A disabled tqdm still starts tqdm's monitor thread, which then outlives the load."""
    gguf = tiny_gguf(tiny_llama(seed=3, vocab_size=64), tmp_path / "model")
    _end_progress_bar_threads()  # writing the GGUF (or an earlier test) drew a bar
    resolve_source(ModelSpec(str(gguf)))
    assert not [thread for thread in threading.enumerate() if isinstance(thread, TMonitor) and thread.is_alive()]


def _end_progress_bar_threads() -> None:
    for thread in threading.enumerate():
        if isinstance(thread, TMonitor):
            thread.exit()
    for bar in (tqdm_std.tqdm, tqdm_auto.tqdm):  # each tqdm class keeps its own monitor
        bar.monitor = None


def test_the_int4_precision_loads_int4_projections_and_an_int8_head(tiny_folder):
    from engine.runtime.int4_weights import Int4Linear
    from engine.runtime.int8_weights import Int8Embedding, Int8Linear

    loaded = load_model(ModelSpec(str(tiny_folder), precision="int4-wo", device="cpu"), runtime="torch")
    model = loaded.model
    projections = [module for layer in model.model.layers for module in layer.modules() if isinstance(module, Int4Linear)]
    assert len(projections) == 7 * len(model.model.layers)
    assert isinstance(model.lm_head, Int8Linear) and isinstance(model.model.embed_tokens, Int8Embedding)
    assert model.dtype == torch.float32
