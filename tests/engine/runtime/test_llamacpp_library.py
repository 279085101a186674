"""llama.cpp as Tandem drives it: a re-quantised copy made once and announced only then, and
the library's own log kept out of what the user reads."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf import GGUFWriter

pytest.importorskip("llama_cpp")

from engine.config import ModelSpec
from engine.errors import ModelLoadError
from engine.models import load_model
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp import load_weights
from tests.engine.tiny_models import tiny_gguf, tiny_llama


@pytest.fixture(scope="module")
def tiny_model_gguf(tmp_path_factory):
    return tiny_gguf(tiny_llama(seed=1, vocab_size=64), tmp_path_factory.mktemp("tiny") / "model")


def test_the_conversion_message_shows_only_when_a_conversion_runs(tiny_model_gguf):
    messages: list[str] = []
    spec = ModelSpec(str(tiny_model_gguf), precision="int8", device="cpu")
    for _load in range(2):
        model = load_model(spec, lambda message, fraction: messages.append(message), runtime="llama.cpp")
        model.close()
    converting = [message for message in messages if message.startswith("Converting")]
    assert converting == [f"Converting {tiny_model_gguf.name} to Q8_0 (first use only)…"]  # the first load only
    assert messages.count("Loading weights (llama.cpp)…") == 2


EMBEDDINGS_WARNING = b"init: embeddings required but some input tokens were not marked as outputs -> overriding\n"


def gguf_of_architecture(path, architecture: str):
    writer = GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama_cpps_log_goes_to_the_debug_log_never_into_an_error(tmp_path, caplog):
    llamacpp_library.library()
    caplog.set_level(logging.DEBUG, logger="tandem.llama_cpp")
    llamacpp_library._log_callback(3, EMBEDDINGS_WARNING, None)  # a warning from an earlier decode, as llama.cpp sends it
    unreadable = tmp_path / "unreadable.gguf"
    unreadable.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelLoadError) as refused:
        load_weights(unreadable, use_gpu=False)
    message = str(refused.value)
    assert message.startswith(f"Could not load the GGUF file {unreadable} with llama.cpp: its format or architecture")
    assert "init:" not in message and "embeddings required" not in message and "gguf" not in message.split(":", 1)[1].lower()
    logged = [record.getMessage() for record in caplog.records if record.name == "tandem.llama_cpp"]
    assert EMBEDDINGS_WARNING.decode().strip() in logged
    assert len(logged) > 1  # and llama.cpp's own words about the file


def test_a_cause_the_log_names_is_said_in_tandems_words(tmp_path):
    with pytest.raises(ModelLoadError) as refused:
        load_weights(gguf_of_architecture(tmp_path / "odd.gguf", "nosucharchitecture"), use_gpu=False)
    message = str(refused.value)
    assert f"does not know the model architecture 'nosucharchitecture': update llama-cpp-python" in message
    assert "llama_model_load" not in message and "\n" not in message
