"""Models found where each app keeps them, on fake home folders laid out as the app lays
them out, with tiny GGUF files written in the test."""
from __future__ import annotations

import json

from gguf import LlamaFileType

from engine.discovery import discover
from engine.discovery.gguf_header import read_gguf_header
from engine.discovery.locations import GPT4ALL, HUGGING_FACE, JAN, LM_STUDIO, OLLAMA, SEARCH_HOME_VARIABLE, USER_FOLDER, model_roots
from tests.engine.discovery.fake_machine import (
    LLAMA_TOKENS,
    OTHER_TOKENS,
    hub_model_folder,
    hub_snapshot,
    lm_studio_model,
    ollama_model,
    parameters,
    write_gguf,
)


def found_by_name(found):
    return {model.name: model for model in found.models}


def test_the_gguf_header_gives_family_quantisation_parameters_and_tokens(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", hidden=16, layers=2, file_type=LlamaFileType.MOSTLY_Q4_K_M, architecture="qwen2")
    header = read_gguf_header(path)
    assert (header.architecture, header.file_type) == ("qwen2", "Q4_K_M")
    assert header.parameters == parameters(hidden=16, layers=2)
    assert header.tokens == LLAMA_TOKENS
    assert header.architecture_value("{arch}.embedding_length") == 16


def test_lm_studio_models_are_found_in_both_of_its_folders_by_publisher_and_repo(tmp_path):
    lm_studio_model(tmp_path, "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q8_0.gguf", hidden=16)
    write_gguf(tmp_path / ".lmstudio/models/bartowski/Llama-3.2-1B-Instruct-GGUF/mmproj-model-f16.gguf")  # an image encoder
    write_gguf(tmp_path / ".cache/lm-studio/models/TheBloke/Old-GGUF/old.Q4_0.gguf", file_type=LlamaFileType.MOSTLY_Q4_0)
    models = found_by_name(discover(home=tmp_path, environ={}))
    assert set(models) == {"bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q8_0", "TheBloke/Old-GGUF/old.Q4_0"}
    llama = models["bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q8_0"]
    assert (llama.app, llama.family, llama.quantisation, llama.parameters) == (LM_STUDIO, "llama", "Q8_0", parameters(hidden=16))
    assert llama.source == str(tmp_path / ".lmstudio/models/bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q8_0.gguf")
    assert llama.usable and llama.vocab_size == len(LLAMA_TOKENS)


def test_an_ollama_manifest_is_resolved_to_its_blob(tmp_path):
    blob = ollama_model(tmp_path, "llama3.2", "1b", hidden=16)
    models = found_by_name(discover(home=tmp_path, environ={}))
    model = models["llama3.2:1b"]
    assert model.source == str(blob) and blob.name.startswith("sha256-")
    assert (model.app, model.family, model.parameters, model.problem) == (OLLAMA, "llama", parameters(hidden=16), None)


def test_ollama_models_outside_its_library_and_in_ollama_models_are_named_as_ollama_names_them(tmp_path):
    ollama_model(tmp_path, "mine", "latest")
    library = tmp_path / ".ollama/models/manifests/registry.ollama.ai/library/mine"
    elsewhere = tmp_path / ".ollama/models/manifests/hf.co/bartowski/SmolLM2-GGUF"
    elsewhere.parent.mkdir(parents=True)
    library.rename(elsewhere)
    moved = tmp_path / "big-disk/ollama"
    moved.parent.mkdir()
    (tmp_path / ".ollama/models").rename(moved)
    found = discover(home=tmp_path, environ={"OLLAMA_MODELS": str(moved)})
    assert [model.name for model in found.models] == ["hf.co/bartowski/SmolLM2-GGUF:latest"]
    assert found.models[0].usable


def test_a_dangling_ollama_blob_is_reported_plainly_not_raised(tmp_path):
    ollama_model(tmp_path, "kept", "7b")
    ollama_model(tmp_path, "gone", "latest", blob_written=False)
    broken = tmp_path / ".ollama/models/manifests/registry.ollama.ai/library/torn/latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    models = found_by_name(discover(home=tmp_path, environ={}))
    assert models["kept:7b"].usable
    gone = models["gone:latest"]
    assert not gone.usable
    assert gone.problem.startswith("Ollama lists gone:latest, but its model file sha256-")
    assert "is not in" in gone.problem and "`ollama pull gone:latest` fetches it again" in gone.problem
    assert "names no model file Tandem can read" in models["torn:latest"].problem


def test_a_cut_or_foreign_gguf_is_reported_with_its_path(tmp_path):
    folder = tmp_path / ".local/share/nomic.ai/GPT4All"
    whole = write_gguf(folder / "whole.gguf")
    (folder / "cut.gguf").write_bytes(whole.read_bytes()[:40])
    (folder / "text.gguf").write_text("not a model at all")
    models = found_by_name(discover(home=tmp_path, environ={}))
    assert models["whole"].usable
    assert models["cut"].problem == f"{folder / 'cut.gguf'} cannot be read: {folder / 'cut.gguf'} ends inside its header."
    assert "is not a GGUF file" in models["text"].problem


def test_the_hub_cache_gives_model_folders_gguf_repos_and_respects_hf_home(tmp_path):
    hub = tmp_path / "hf/hub"
    snapshot = hub_model_folder(hub, "HuggingFaceTB/SmolLM2-135M", hidden=4)
    stale = snapshot.parent / "old-revision"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # a revision refs/main no longer names
    write_gguf(hub_snapshot(hub, "bartowski/Tiny-GGUF") / "Tiny-Q4_K_M.gguf", file_type=LlamaFileType.MOSTLY_Q4_K_M)
    for environ in ({"HF_HOME": str(tmp_path / "hf")}, {"HF_HUB_CACHE": str(hub)}):
        models = found_by_name(discover(home=tmp_path / "elsewhere", environ=environ))
        assert set(models) == {"HuggingFaceTB/SmolLM2-135M", "bartowski/Tiny-GGUF/Tiny-Q4_K_M"}
        folder = models["HuggingFaceTB/SmolLM2-135M"]
        assert (folder.app, folder.source, folder.family, folder.quantisation) == (HUGGING_FACE, str(snapshot), "llama", "BF16")
        assert folder.parameters == len(LLAMA_TOKENS) * 4
        # The folder's tokenizer.json and a GGUF file with the same tokens are one tokenizer.
        assert folder.tokenizer == models["bartowski/Tiny-GGUF/Tiny-Q4_K_M"].tokenizer


def test_a_hub_download_whose_blob_is_gone_is_incomplete(tmp_path):
    hub = tmp_path / ".cache/huggingface/hub"
    snapshot = hub_model_folder(hub, "org/half")
    (snapshot / "model.safetensors").resolve().unlink()
    (model,) = discover(home=tmp_path, environ={}).models
    assert model.problem == f"{snapshot / 'model.safetensors'} is missing: the download is incomplete."


def test_gpt4all_and_jan_folders(tmp_path):
    write_gguf(tmp_path / ".local/share/nomic.ai/GPT4All/Meta-Llama-3-8B-Instruct.Q4_0.gguf")
    write_gguf(tmp_path / "jan/models/mistral-ins-7b-q4/mistral-7b-instruct-v0.2.Q4_K_M.gguf")
    write_gguf(tmp_path / ".local/share/Jan/data/models/llamacpp/qwen3-0.6b/model.gguf", tokens=OTHER_TOKENS)
    models = found_by_name(discover(home=tmp_path, environ={}))
    assert {name: model.app for name, model in models.items()} == {
        "Meta-Llama-3-8B-Instruct.Q4_0": GPT4ALL, "mistral-7b-instruct-v0.2.Q4_K_M": JAN, "qwen3-0.6b": JAN,
    }


def test_a_folder_the_user_added_is_searched_for_files_and_model_folders(tmp_path):
    mine = tmp_path / "my-models"
    write_gguf(mine / "downloads/draft.gguf")
    hub_model_folder(tmp_path / "scratch", "x/y")
    (tmp_path / "scratch/models--x--y/snapshots/0123abcd").rename(mine / "folder-model")
    found = discover([mine], home=tmp_path / "empty-home", environ={})
    assert {(model.name, model.app, model.usable) for model in found.models} == {
        ("downloads/draft", USER_FOLDER, True), ("folder-model", USER_FOLDER, True),
    }
    (itself,) = discover([mine / "folder-model"], home=tmp_path / "empty-home", environ={}).models
    assert itself.name == "folder-model"  # a model folder added as it is, named by its own name


def test_a_split_model_lists_its_first_part_and_says_when_a_part_is_missing(tmp_path):
    folder = tmp_path / ".lmstudio/models/org/Big-GGUF"
    for part in (1, 2):
        write_gguf(folder / f"Big-Q8_0-0000{part}-of-00003.gguf")
    (model,) = discover(home=tmp_path, environ={}).models
    assert model.name == "org/Big-GGUF/Big-Q8_0-00001-of-00003"
    assert model.problem == "Big-Q8_0-00003-of-00003.gguf is missing: a model split in 3 files needs all of them."


def test_a_rewritten_file_is_described_again(tmp_path):
    path = write_gguf(tmp_path / ".local/share/nomic.ai/GPT4All/m.gguf", hidden=8)
    assert discover(home=tmp_path, environ={}).models[0].hidden_size == 8
    write_gguf(path, hidden=24)
    assert discover(home=tmp_path, environ={}).models[0].hidden_size == 24


def test_tandem_search_home_stands_in_for_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(SEARCH_HOME_VARIABLE, str(tmp_path))
    monkeypatch.setenv("HF_HOME", "/somewhere/real")
    monkeypatch.setenv("OLLAMA_MODELS", "/somewhere/real/ollama")
    roots = model_roots()
    assert all(root.folder.is_relative_to(tmp_path) for root in roots)
    assert {root.app for root in roots} == {LM_STUDIO, OLLAMA, HUGGING_FACE, GPT4ALL, JAN}
    assert discover().models == ()  # nothing there, and no error for folders that are not
    json.dumps([root.folder.as_posix() for root in roots])
