"""What Tandem knows of a model it found on disk, read from headers alone: its family, size,
quantisation, tokenizer and where it lives. Nothing is copied and no weights are read.

A model that is there but cannot be used (a file gone missing, a header cut short) is still
described, with `problem` saying plainly what is wrong, so the user sees why it is not offered.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import Keys

from .gguf_header import UnreadableGGUF, read_gguf_header, tokens_digest

SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
# What config.json's torch_dtype is called beside GGUF file types.
DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
EAGLE3_MARK = "eagle3"  # in an EAGLE-3 head's architectures: LlamaForCausalLMEagle3


@dataclass(frozen=True)
class FoundModel:
    source: str  # what a pair names: a .gguf file or a model folder
    name: str  # what its app calls it: "llama3.2:1b", "bartowski/Llama-3.2-1B-Instruct-GGUF"
    app: str  # where it was found (locations.LM_STUDIO, …)
    family: str = ""  # the architecture: llama, qwen2, gemma3…
    parameters: int | None = None
    file_bytes: int = 0
    quantisation: str = ""  # Q4_K_M, Q8_0, BF16…
    tokenizer: str | None = None  # tokens_digest of its token list: equal for models that share a tokenizer
    vocab_size: int | None = None
    hidden_size: int | None = None
    sliding_window: bool = False  # some layers see a window only: no token trees (engine/methods.py)
    problem: str | None = None  # why it cannot be used, said plainly; None when it can

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def size_label(self) -> str:
        """Its parameter count where the header gives it, else its size on disk."""
        if self.parameters:
            return _short_number(self.parameters, ("", "K", "M", "B", "T"), 1000)
        return _short_number(self.file_bytes, (" B", " KB", " MB", " GB", " TB"), 1000) if self.file_bytes else ""


@dataclass(frozen=True)
class FoundHead:
    """An EAGLE-3 head: it drafts from the features of a target with its hidden width and vocabulary."""

    source: str
    name: str
    app: str
    target_hidden_size: int | None
    vocab_size: int | None


def describe_gguf(path: Path, name: str, app: str) -> FoundModel:
    """A GGUF file's model, or one whose `problem` says why the file cannot be read."""
    try:
        file_bytes = path.stat().st_size
    except OSError:
        return FoundModel(str(path), name, app, problem=f"{path} is missing: the file was moved or deleted.")
    try:
        header = read_gguf_header(path)
    except (OSError, UnreadableGGUF, ValueError) as error:
        return FoundModel(str(path), name, app, file_bytes=file_bytes, problem=f"{path} cannot be read: {error}.")
    hidden = header.architecture_value(Keys.LLM.EMBEDDING_LENGTH)
    return FoundModel(
        str(path), name, app,
        family=header.architecture,
        parameters=header.parameters or None,
        file_bytes=file_bytes,
        quantisation=header.file_type,
        tokenizer=tokens_digest(header.tokens) if header.tokens else None,
        vocab_size=len(header.tokens) or None,
        hidden_size=int(hidden) if isinstance(hidden, int) else None,
        sliding_window=bool(header.architecture_value(Keys.Attention.SLIDING_WINDOW)),
        problem=None if header.tokens else f"{path} has no tokenizer in it, so Tandem cannot run it.",
    )


def is_vision_projector(path: Path) -> bool:
    """LM Studio and Hugging Face GGUF repos keep a vision model's image encoder beside it
    (mmproj-*.gguf): a part of a model, not a model to chat with."""
    return path.name.lower().startswith("mmproj")


def read_config(folder: Path) -> dict | None:
    """A model folder's config.json, or None when it has none that parses."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_eagle3_head(config: dict) -> bool:
    return any(EAGLE3_MARK in str(name).lower() for name in config.get("architectures") or [])


def describe_head(folder: Path, config: dict, name: str, app: str) -> FoundHead:
    target_hidden = config.get("target_hidden_size") or config.get("hidden_size")
    vocab = config.get("vocab_size")
    return FoundHead(
        str(folder), name, app,
        target_hidden_size=target_hidden if isinstance(target_hidden, int) else None,
        vocab_size=vocab if isinstance(vocab, int) else None,
    )


def describe_folder(folder: Path, config: dict, name: str, app: str) -> FoundModel:
    """A Hugging Face model folder's model (config.json, safetensors, tokenizer.json)."""
    weights = sorted(folder.glob("*.safetensors"))
    missing = [path for path in [folder / "config.json", *weights] if not path.exists()]
    if missing:  # in the hub cache, a link whose blob is gone
        return FoundModel(str(folder), name, app, problem=f"{missing[0]} is missing: the download is incomplete.")
    parameters = _safetensors_parameters(weights)
    tokens = _tokenizer_json_tokens(folder / "tokenizer.json")
    quantisation = (config.get("quantization_config") or {}).get("quant_method") or config.get("torch_dtype") or config.get("dtype")
    hidden = config.get("hidden_size")
    return FoundModel(
        str(folder), name, app,
        family=str(config.get("model_type") or ""),
        parameters=parameters,
        file_bytes=sum(path.stat().st_size for path in weights),
        quantisation=DTYPE_NAMES.get(str(quantisation), str(quantisation or "")),
        tokenizer=tokens_digest(tokens) if tokens else None,
        vocab_size=len(tokens) if tokens else None,
        hidden_size=hidden if isinstance(hidden, int) else None,
        # As the runtime judges it (engine/runtime/torch_eager.py keeps_every_position).
        sliding_window=bool(config.get("use_sliding_window", True) and config.get("sliding_window")),
        problem=None if weights else f"{folder} has no safetensors weights.",
    )


def folder_tokens(source: str) -> list[str]:
    """The token list of a found model, read again (for saying where two tokenizers differ)."""
    path = Path(source)
    if path.suffix.lower() == ".gguf":
        return read_gguf_header(path).tokens
    return _tokenizer_json_tokens(path / "tokenizer.json") or []


def _tokenizer_json_tokens(path: Path) -> list[str] | None:
    """tokenizer.json's tokens by id (its model's vocabulary and its added tokens), as
    transformers' convert_ids_to_tokens gives them; None when there is no such file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        vocabulary = data["model"]["vocab"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    if isinstance(vocabulary, list):  # Unigram: [piece, score] by id
        by_id = {index: entry[0] for index, entry in enumerate(vocabulary)}
    else:
        by_id = {token_id: token for token, token_id in vocabulary.items()}
    by_id.update((entry["id"], entry["content"]) for entry in data.get("added_tokens", []))
    return [by_id.get(token_id, "") for token_id in range(max(by_id, default=-1) + 1)]


def _safetensors_parameters(weights: list[Path]) -> int | None:
    total = 0
    for path in weights:
        try:
            with path.open("rb") as file:
                (length,) = struct.unpack("<Q", file.read(8))
                if length > SAFETENSORS_MAX_HEADER:
                    return None
                header = json.loads(file.read(length))
        except (OSError, struct.error, ValueError):
            return None
        for key, entry in header.items():
            if key != "__metadata__":
                elements = 1
                for dimension in entry.get("shape", []):
                    elements *= dimension
                total += elements
    return total or None


def _short_number(value: int, units: tuple[str, ...], step: int) -> str:
    index = 0
    number = float(value)
    while number >= step and index < len(units) - 1:
        number /= step
        index += 1
    shown = f"{number:.1f}" if number < 10 and index else f"{number:.0f}"
    return f"{shown}{units[index]}"
