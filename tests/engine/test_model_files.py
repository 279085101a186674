"""A pair's model files checked when it is saved and when it is loaded: a truncated or
corrupt file is refused with one sentence that says what to do."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from gguf import GGUFWriter
import numpy as np

from engine.config import ModelSpec, PairConfig
from engine.errors import ModelLoadError
from engine.model_files import BrokenModelFile, check_model_files, check_pair_files
from engine.models import load_model, load_tokenizer_only
from tests.engine.tiny_models import WORDS, tiny_gguf, tiny_llama

TRUNCATED = re.compile(r"is truncated: the file ends at (\d+) bytes but its tensors need (\d+)\. Download or copy it again")


@pytest.fixture(scope="module")
def whole_gguf(tmp_path_factory):
    return tiny_gguf(tiny_llama(seed=4, vocab_size=64), tmp_path_factory.mktemp("gguf") / "model")


@pytest.fixture(scope="module")
def whole_folder(tmp_path_factory, make_word_tokenizer):
    folder = tmp_path_factory.mktemp("folder")
    tiny_llama(seed=5, vocab_size=64).save_pretrained(folder)
    make_word_tokenizer(WORDS).save_pretrained(folder)
    return folder


def cut(source, destination, keep_fraction: float):
    data = source.read_bytes()
    destination.write_bytes(data[: int(len(data) * keep_fraction)])
    return destination


def one_line(error: Exception) -> str:
    text = str(error)
    assert "\n" not in text
    return text


def test_whole_files_pass(whole_gguf, whole_folder):
    check_model_files(ModelSpec(str(whole_gguf)))
    check_model_files(ModelSpec(str(whole_folder)))
    check_pair_files(PairConfig("whole", ModelSpec(str(whole_gguf)), ModelSpec(str(whole_folder))))


def test_a_truncated_gguf_is_refused_saying_how_short_it_is(whole_gguf, tmp_path):
    broken = cut(whole_gguf, tmp_path / "broken.gguf", 0.8)
    with pytest.raises(BrokenModelFile) as refused:
        check_model_files(ModelSpec(str(broken)))
    ends_at, needed = map(int, TRUNCATED.search(one_line(refused.value)).groups())
    assert ends_at == broken.stat().st_size and needed == whole_gguf.stat().st_size


def test_a_gguf_cut_inside_its_header_or_not_a_gguf_at_all_is_refused(whole_gguf, tmp_path):
    with pytest.raises(BrokenModelFile, match="inside its header"):
        check_model_files(ModelSpec(str(cut(whole_gguf, tmp_path / "header.gguf", 0.001))))
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(BrokenModelFile, match="is not a readable GGUF file: it does not start with the GGUF magic"):
        check_model_files(ModelSpec(str(tmp_path / "text.gguf")))


def test_a_gguf_without_a_tokenizer_is_refused(tmp_path):
    path = tmp_path / "no-tokenizer.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BrokenModelFile, match="has no tokenizer in it"):
        check_model_files(ModelSpec(str(path)))


@pytest.mark.parametrize("runtime", ["torch", "llama.cpp"])
def test_loading_a_truncated_gguf_as_a_draft_gives_the_sentence_not_a_reader_error(whole_gguf, tmp_path, runtime):
    if runtime == "llama.cpp":
        pytest.importorskip("llama_cpp")
    broken = cut(whole_gguf, tmp_path / "draft.gguf", 0.6)
    with pytest.raises(ModelLoadError) as refused:
        load_model(ModelSpec(str(broken), device="cpu"), as_draft=True, runtime=runtime)
    assert TRUNCATED.search(one_line(refused.value)) and "reshape" not in str(refused.value)
    with pytest.raises(BrokenModelFile):
        load_tokenizer_only(ModelSpec(str(broken)))  # what the pair picker asks of a draft


def copy_folder(source, tmp_path):
    return shutil.copytree(source, tmp_path / "model")


def test_a_truncated_safetensors_file_is_refused(whole_folder, tmp_path):
    folder = copy_folder(whole_folder, tmp_path)
    cut(whole_folder / "model.safetensors", folder / "model.safetensors", 0.5)
    with pytest.raises(BrokenModelFile) as refused:
        load_model(ModelSpec(str(folder), device="cpu"), runtime="torch")
    assert TRUNCATED.search(one_line(refused.value)) and "model.safetensors" in str(refused.value)
    cut(whole_folder / "model.safetensors", folder / "model.safetensors", 0.00001)
    with pytest.raises(BrokenModelFile, match="inside its header"):
        check_model_files(ModelSpec(str(folder)))


def test_a_shard_the_index_names_must_be_there(whole_folder, tmp_path):
    folder = copy_folder(whole_folder, tmp_path)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                                            "model.norm.weight": "model.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(BrokenModelFile, match="lacks model-00002-of-00002.safetensors, which its index names"):
        check_model_files(ModelSpec(str(folder)))


def test_a_folder_without_a_readable_tokenizer_is_refused(whole_folder, tmp_path):
    folder = copy_folder(whole_folder, tmp_path)
    (folder / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(BrokenModelFile, match="tokenizer.json cannot be read"):
        check_model_files(ModelSpec(str(folder)))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(BrokenModelFile, match="has no tokenizer"):
        check_pair_files(PairConfig("no tokenizer", ModelSpec(str(whole_folder)), ModelSpec(str(folder))))


def test_what_is_not_on_this_machine_is_left_to_loading(tmp_path):
    check_model_files(ModelSpec(str(tmp_path / "gone.gguf")))
    check_model_files(ModelSpec("HuggingFaceTB/SmolLM2-360M-Instruct"))
