"""A machine's home folder laid out as LM Studio, Ollama, the Hugging Face hub cache, GPT4All
and Jan lay out their models, with tiny GGUF files written here (a few KB each: a token
list, llama metadata, one small tensor per layer)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType
from safetensors.numpy import save_file

# Two tokenizers: models of one family share the first, the other family has its own.
LLAMA_TOKENS = ["<unk>", "<s>", "</s>", *(f"▁w{i}" for i in range(61))]
OTHER_TOKENS = ["<pad>", "<eos>", *(f"x{i}" for i in range(70))]
OLLAMA_LIBRARY = Path("manifests/registry.ollama.ai/library")


def write_gguf(
    path: Path, tokens: list[str] = LLAMA_TOKENS, hidden: int = 8, layers: int = 1,
    file_type: LlamaFileType = LlamaFileType.MOSTLY_Q8_0, architecture: str = "llama", sliding_window: int | None = None,
) -> Path:
    """A GGUF file the way llama.cpp's converter writes one, scaled down: its parameters are
    len(tokens) * hidden (the embedding) plus hidden * hidden per layer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), architecture)
    writer.add_name(path.stem)
    writer.add_file_type(int(file_type))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_context_length(256)
    if sliding_window:
        writer.add_sliding_window(sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), hidden), dtype=np.float32))
    for layer in range(layers):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((hidden, hidden), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def parameters(tokens: list[str] = LLAMA_TOKENS, hidden: int = 8, layers: int = 1) -> int:
    return len(tokens) * hidden + layers * hidden * hidden


def lm_studio_model(home: Path, publisher: str, repo: str, file: str, **gguf) -> Path:
    return write_gguf(home / ".lmstudio/models" / publisher / repo / file, **gguf)


def ollama_model(home: Path, name: str, tag: str, blob_written: bool = True, **gguf) -> Path:
    """A manifest whose model layer names a blob by its sha256, and (unless not) the blob."""
    models = home / ".ollama/models"
    staging = write_gguf(models / f"{name}-{tag}.gguf", **gguf)  # its name in the file: one blob per model
    data = staging.read_bytes()
    staging.unlink()
    digest = hashlib.sha256(data).hexdigest()
    blob = models / "blobs" / f"sha256-{digest}"
    if blob_written:
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
    manifest = models / OLLAMA_LIBRARY / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10},
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
        ],
    }))
    return blob


def hub_snapshot(hub: Path, repo_id: str, revision: str = "0123abcd") -> Path:
    """models--ORG--NAME with refs/main naming the snapshot folder, returned empty to fill."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs/main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def hub_model_folder(hub: Path, repo_id: str, tokens: list[str] = LLAMA_TOKENS, hidden: int = 8) -> Path:
    """A safetensors model as the hub caches it: files in the snapshot linked to blobs/."""
    snapshot = hub_snapshot(hub, repo_id)
    blobs = snapshot.parent.parent / "blobs"
    blobs.mkdir(exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "vocab_size": len(tokens), "torch_dtype": "bfloat16"}
    tokenizer = {"model": {"type": "BPE", "vocab": {token: index for index, token in enumerate(tokens)}, "merges": []},
                 "added_tokens": []}
    weights = blobs / "weights"
    save_file({"model.embed_tokens.weight": np.zeros((len(tokens), hidden), dtype=np.float32)}, str(weights))
    for name, text in (("config.json", json.dumps(config)), ("tokenizer.json", json.dumps(tokenizer))):
        (blobs / name).write_text(text)
        (snapshot / name).symlink_to(blobs / name)
    (snapshot / "model.safetensors").symlink_to(weights)
    return snapshot


def eagle3_head(folder: Path, vocab_size: int, target_hidden_size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": target_hidden_size,
        "target_hidden_size": target_hidden_size, "vocab_size": vocab_size, "draft_vocab_size": 32,
    }))
    save_file({"fc.weight": np.zeros((target_hidden_size, 3 * target_hidden_size), dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


def furnished_home(home: Path) -> dict[str, Path]:
    """One home with a model in each app's folders: a llama-tokenizer family at three sizes,
    one of another tokenizer, an EAGLE-3 head for the largest, and a dangling Ollama blob."""
    return {
        "target": lm_studio_model(home, "lmstudio-community", "Llama-Big-GGUF", "Llama-Big-Q4_K_M.gguf", hidden=64, layers=4,
                                  file_type=LlamaFileType.MOSTLY_Q4_K_M),
        "ollama draft": ollama_model(home, "llama-small", "1b", hidden=16),
        "gpt4all draft": write_gguf(home / ".local/share/nomic.ai/GPT4All/llama-tiny.Q8_0.gguf", hidden=8),
        "jan other": write_gguf(home / "jan/models/other-7b/other-7b.gguf", tokens=OTHER_TOKENS, hidden=32,
                                file_type=LlamaFileType.MOSTLY_F16, architecture="qwen2"),
        "hub folder": hub_model_folder(home / ".cache/huggingface/hub", "org/llama-mini", hidden=4),
        "hub head": eagle3_head(hub_snapshot(home / ".cache/huggingface/hub", "someone/EAGLE3-Llama-Big"), len(LLAMA_TOKENS), 64),
        "dangling": ollama_model(home, "gone", "latest", blob_written=False, hidden=16),
    }
