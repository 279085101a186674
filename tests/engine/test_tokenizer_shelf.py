"""Tokenizers kept between pair loads: read once while their files stay, dropped with the pairs
that used them."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import models, tokenizer_shelf
from engine.config import ModelSpec, PairConfig
from engine.session import load_pair


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, make_word_tokenizer) -> Path:
    """A randomly initialised one-layer Llama with a word tokenizer, saved like a hub model."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = make_word_tokenizer(["the", "capital", "of", "france", "is", "paris"])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """The folders whose tokenizer was read from disk, in order, from an empty shelf."""
    monkeypatch.setattr(tokenizer_shelf, "_shelf", {})
    read: list[Path] = []
    real_read = models._read_tokenizer

    def counted(folder: Path):
        read.append(folder)
        return real_read(folder)

    monkeypatch.setattr(models, "_read_tokenizer", counted)
    return read


def copy_of(folder: Path, destination: Path) -> Path:
    shutil.copytree(folder, destination)
    return destination


def alone(folder: Path) -> PairConfig:
    return PairConfig("tiny", ModelSpec(str(folder), precision="fp32", device="cpu"), runtime="torch")


def test_a_folder_read_again_hands_back_the_same_tokenizer_until_a_file_there_changes(tiny_folder, tmp_path, reads):
    folder = copy_of(tiny_folder, tmp_path / "model")
    first = models._load_tokenizer(folder)

    assert models._load_tokenizer(folder) is first
    assert reads == [folder]

    # The same size, only a newer time: a file edited in place still counts as changed.
    config = folder / "tokenizer_config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = models._load_tokenizer(folder)

    assert again is not first
    assert reads == [folder, folder]


def test_switching_between_pairs_that_share_a_target_reads_its_tokenizer_once(tiny_folder, tmp_path, reads):
    shared = copy_of(tiny_folder, tmp_path / "shared")
    other = copy_of(tiny_folder, tmp_path / "other")

    first = load_pair(alone(shared))
    tokenizer = first.tokenizer
    first.close()
    second = load_pair(PairConfig("tiny n-gram", ModelSpec(str(shared), precision="fp32", device="cpu"), runtime="torch"))

    assert second.tokenizer is tokenizer
    assert reads == [shared]

    # A pair that does not use it lets it go: the shelf holds nothing the loaded pair does not.
    second.close()
    load_pair(alone(other)).close()
    load_pair(alone(shared)).close()

    assert reads == [shared, other, shared]


def test_a_tokenizer_that_fails_to_read_is_not_shelved(tmp_path, reads):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{ not json")

    for _ in range(2):
        with pytest.raises(models.ModelLoadError, match="Could not read the tokenizer"):
            models._load_tokenizer(broken)

    assert reads == [broken, broken]


def test_a_missing_folder_is_refused_in_the_reads_own_words(tmp_path, reads):
    with pytest.raises(models.ModelLoadError, match="Could not read the tokenizer"):
        models._load_tokenizer(tmp_path / "gone")
