"""Checking a model's files before they are saved in a pair or loaded: enough of each file
is read to know it is whole, so that a broken download is refused with one sentence that
says what to do, not with the reshape error a reader raises deep inside a half file.

- a GGUF file: its header, its metadata, its tensors' table, and that the file is long
  enough for the tensor data that table describes; a tokenizer in its metadata;
- a Hugging Face folder: config.json, every safetensors file's header and length (the
  shards an index names included), a tokenizer file that parses.

Only headers are read (milliseconds for a small model, well under a second for a large
vocabulary); the tensor data itself is never touched.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .config import DEMO_TARGET, ModelSpec, PairConfig
from .demo_model import demo_gguf_path
from .errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
# GGUF metadata value types: their fixed sizes in bytes; 8 (string) and 9 (array) vary.
GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_STRING, GGUF_ARRAY, GGUF_UINT32 = 8, 9, 4
# A header field longer than this is a corrupt length, not a real string or array.
MAX_HEADER_ITEMS = 1 << 32
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
# What a tokenizer can be saved as: fast (tokenizer.json), BPE (vocab.json), WordPiece
# (vocab.txt), SentencePiece (tokenizer.model, spiece.model, ...), tiktoken (*.tiktoken).
TOKENIZER_NAMES = ("tokenizer.json", "vocab.json", "vocab.txt")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")

REDOWNLOAD = "Download or copy it again, then choose it again."


class BrokenModelFile(ModelLoadError):
    """A model file that is there but cannot be used: truncated, corrupt, or incomplete."""


def check_pair_files(pair: PairConfig) -> None:
    """Refuse a pair one of whose models has a broken file (BrokenModelFile, one line)."""
    for spec in (pair.target, pair.draft):
        if spec is not None:
            check_model_files(spec)


def check_model_files(spec: ModelSpec) -> None:
    """Check the files behind `spec` where they are on this machine: a GGUF file or a model
    folder. A repo id not downloaded yet, or a path that is not there, is left to loading,
    which says what is missing; what is here must be whole."""
    path = _local_path(spec)
    if path is None or not path.exists():
        return
    if path.is_file() and path.suffix.lower() == ".gguf":
        check_gguf(path)
    elif path.is_dir():
        check_model_folder(path)


def _local_path(spec: ModelSpec) -> Path | None:
    if spec.source == DEMO_TARGET:
        try:
            return demo_gguf_path()
        except ModelLoadError:
            return None  # not installed: loading says how to install it
    return Path(spec.source).expanduser()


# GGUF


def check_gguf(path: Path) -> None:
    """A whole GGUF file: a readable header, a tokenizer, and all of its tensors' data."""
    size = path.stat().st_size
    try:
        with path.open("rb") as file:
            metadata, tensors, header_end = _read_gguf_header(file)
    except (struct.error, EOFError) as error:
        raise BrokenModelFile(
            f"{path} is truncated: the file ends at {size} bytes, inside its header. {REDOWNLOAD}"
        ) from error
    except ValueError as error:
        raise BrokenModelFile(f"{path} is not a readable GGUF file: {error}. {REDOWNLOAD}") from error
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    data_start = _aligned(header_end, alignment if isinstance(alignment, int) and alignment > 0 else GGUF_DEFAULT_ALIGNMENT)
    needed = data_start + max((offset + length for offset, length in tensors), default=0)
    if size < needed:
        raise BrokenModelFile(
            f"{path} is truncated: the file ends at {size} bytes but its tensors need {needed}. {REDOWNLOAD}"
        )
    if "tokenizer.ggml.tokens" not in metadata:
        raise BrokenModelFile(
            f"{path} has no tokenizer in it (no tokenizer.ggml.tokens): use a GGUF export that includes one."
        )


def _read_gguf_header(file: BinaryIO) -> tuple[dict[str, object], list[tuple[int, int]], int]:
    """(scalar metadata, (offset, length) of each tensor's data, where the header ends);
    arrays are skipped, only their presence noted (value None)."""
    if file.read(4) != GGUF_MAGIC:
        raise ValueError("it does not start with the GGUF magic bytes")
    version, tensor_count, metadata_count = _unpack(file, "<IQQ")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not one this reader knows (2 or 3)")
    if tensor_count > MAX_HEADER_ITEMS or metadata_count > MAX_HEADER_ITEMS:
        raise ValueError("its header counts are impossibly large")
    metadata: dict[str, object] = {}
    for _ in range(metadata_count):
        key = _read_string(file)
        (value_type,) = _unpack(file, "<I")
        metadata[key] = _read_value(file, value_type)
    tensors = []
    for _ in range(tensor_count):
        name = _read_string(file)
        (dimensions,) = _unpack(file, "<I")
        if dimensions > 8:
            raise ValueError(f"tensor {name} claims {dimensions} dimensions")
        shape = _unpack(file, f"<{dimensions}Q")
        tensor_type, offset = _unpack(file, "<IQ")
        tensors.append((offset, _tensor_bytes(name, shape, tensor_type)))
    return metadata, tensors, file.tell()


def _tensor_bytes(name: str, shape: tuple[int, ...], tensor_type: int) -> int:
    try:
        block_size, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor_type)]
    except (ValueError, KeyError) as error:
        raise ValueError(f"tensor {name} has an unknown type {tensor_type}") from error
    elements = 1
    for dimension in shape:
        elements *= dimension
    return elements // block_size * block_bytes


def _read_value(file: BinaryIO, value_type: int) -> object:
    if value_type == GGUF_STRING:
        return _read_string(file)
    if value_type == GGUF_ARRAY:
        element_type, count = _unpack(file, "<IQ")
        if count > MAX_HEADER_ITEMS:
            raise ValueError("an array in its metadata is impossibly long")
        if element_type in GGUF_SCALAR_SIZES:
            _skip(file, count * GGUF_SCALAR_SIZES[element_type])
        else:
            for _ in range(count):
                _read_value(file, element_type)  # strings, or arrays of arrays
        return None
    if value_type not in GGUF_SCALAR_SIZES:
        raise ValueError(f"its metadata has a value of unknown type {value_type}")
    if value_type in (GGUF_UINT32, 10):  # the unsigned integers that hold sizes such as the alignment
        return _unpack(file, "<I" if value_type == GGUF_UINT32 else "<Q")[0]
    _skip(file, GGUF_SCALAR_SIZES[value_type])
    return True


def _read_string(file: BinaryIO) -> str:
    (length,) = _unpack(file, "<Q")
    if length > MAX_HEADER_ITEMS:
        raise ValueError("a string in its header is impossibly long")
    data = file.read(length)
    if len(data) < length:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _skip(file: BinaryIO, length: int) -> None:
    """Move past `length` bytes; EOFError when the file ends first."""
    if length:
        file.seek(length - 1, 1)
        if not file.read(1):
            raise EOFError


def _unpack(file: BinaryIO, layout: str) -> tuple:
    return struct.unpack(layout, file.read(struct.calcsize(layout)))


def _aligned(position: int, alignment: int) -> int:
    return (position + alignment - 1) // alignment * alignment


# Hugging Face folders


def check_model_folder(folder: Path) -> None:
    """A folder whose config, weights and tokenizer can be read. One without config.json is
    left to loading, which explains what a model folder is."""
    if not (folder / "config.json").is_file():
        return
    _check_json(folder / "config.json")
    for weights in _safetensors_files(folder):
        check_safetensors(weights)
    tokenizers = [path for path in sorted(folder.iterdir()) if path.is_file()
                  and (path.name in TOKENIZER_NAMES or path.suffix in TOKENIZER_SUFFIXES)]
    if not tokenizers:
        raise BrokenModelFile(
            f"{folder} has no tokenizer (no tokenizer.json, vocab.json, vocab.txt, *.model or *.tiktoken): "
            "copy the model's tokenizer files into it."
        )
    for tokenizer in tokenizers:
        if tokenizer.suffix == ".json":
            _check_json(tokenizer)
        elif tokenizer.stat().st_size == 0:
            raise BrokenModelFile(f"{tokenizer} is empty. {REDOWNLOAD}")


def _safetensors_files(folder: Path) -> list[Path]:
    """The weights files of `folder`: those its index names (each must be there), or all."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(folder.glob("*.safetensors"))
    shards = sorted(set(_check_json(index).get("weight_map", {}).values()))
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if missing:
        raise BrokenModelFile(
            f"{folder} lacks {missing[0]}" + (f" and {len(missing) - 1} more weights files" if len(missing) > 1 else "")
            + f", which its index names. {REDOWNLOAD}"
        )
    return [folder / shard for shard in shards]


def check_safetensors(path: Path) -> None:
    """A whole safetensors file: its JSON header, and data as long as that header says."""
    size = path.stat().st_size
    with path.open("rb") as file:
        start = file.read(8)
        if len(start) < 8:
            raise BrokenModelFile(f"{path} is truncated: the file ends at {size} bytes, inside its header. {REDOWNLOAD}")
        (header_length,) = struct.unpack("<Q", start)
        if header_length > SAFETENSORS_MAX_HEADER:
            raise BrokenModelFile(f"{path} is not a safetensors file (its header length is impossible). {REDOWNLOAD}")
        header_bytes = file.read(header_length)
    if len(header_bytes) < header_length:
        raise BrokenModelFile(f"{path} is truncated: the file ends at {size} bytes, inside its header. {REDOWNLOAD}")
    try:
        header = json.loads(header_bytes)
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise BrokenModelFile(f"{path} has a corrupt header ({error}). {REDOWNLOAD}") from error
    needed = 8 + header_length + max(ends, default=0)
    if size < needed:
        raise BrokenModelFile(
            f"{path} is truncated: the file ends at {size} bytes but its tensors need {needed}. {REDOWNLOAD}"
        )


def _check_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BrokenModelFile(f"{path} cannot be read ({error}). {REDOWNLOAD}") from error
    if not isinstance(data, dict):
        raise BrokenModelFile(f"{path} is not the JSON object it should be. {REDOWNLOAD}")
    return data
