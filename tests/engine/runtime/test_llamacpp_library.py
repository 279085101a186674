"""llama.cpp as Tandem drives it: a re-quantised copy made once and announced only then, and
the library's own log kept out of what the user reads."""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from engine.config import ModelSpec
from engine.models import load_model
from engine.runtime import llamacpp_library
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
