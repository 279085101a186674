"""What a GGUF file says about its model, read from its header only: architecture, name,
file type (its quantisation), parameter count, widths, and its tokenizer's token list.

gguf's own `GGUFReader` maps every array of the header into numpy objects: 4.3 s for the
demo target's 49k-token vocabulary (and its merges) on the development CPU, far too slow to
run over every model on a disk. This reads the same layout front to back, keeping the
scalars and the token list, stepping over the other arrays, and never touching tensor data:
milliseconds per file. The names and numbers of the format are gguf's (`gguf.constants`).
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf.constants import GGUF_MAGIC, GGUFValueType, Keys, LlamaFileType

# The fixed-size value types, as struct formats.
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
# A length past this is a corrupt header, not a real string or array.
MAX_HEADER_ITEMS = 1 << 32
READ_BUFFER = 1 << 20


class UnreadableGGUF(ValueError):
    """A file that is not a GGUF file, or whose header ends early or is corrupt."""


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, object]  # scalars and strings; arrays other than the token list are left out
    tokens: list[str]  # tokenizer.ggml.tokens, by id ([] when the file has none)
    parameters: int  # elements in all its tensors

    @property
    def architecture(self) -> str:
        return str(self.metadata.get(Keys.General.ARCHITECTURE, ""))

    def architecture_value(self, key_template: str) -> object:
        """A per-architecture key such as `{arch}.embedding_length`."""
        return self.metadata.get(key_template.format(arch=self.architecture))

    @property
    def file_type(self) -> str:
        """The quantisation llama.cpp names the file by: Q4_K_M, Q8_0, F16…; "" when unsaid."""
        value = self.metadata.get(Keys.General.FILE_TYPE)
        try:
            name = LlamaFileType(value).name
        except ValueError:
            return ""
        return name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`; UnreadableGGUF when it cannot be read."""
    try:
        with path.open("rb", buffering=READ_BUFFER) as file:
            return _read(file)
    except (struct.error, EOFError) as error:
        raise UnreadableGGUF(f"{path} ends inside its header") from error


def tokens_digest(tokens: list[str]) -> str:
    """One string that is equal for two token lists exactly when the lists are equal
    (each token is length-prefixed, so no two lists run together into one text)."""
    digest = hashlib.sha256()
    for token in tokens:
        data = token.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(4, "little"))
        digest.update(data)
    return digest.hexdigest()


def _read(file: BinaryIO) -> GGUFHeader:
    if _unpack(file, "<I")[0] != GGUF_MAGIC:
        raise UnreadableGGUF(f"{file.name} is not a GGUF file (it does not start with the GGUF magic bytes)")
    version, tensor_count, metadata_count = _unpack(file, "<IQQ")
    if version not in (2, 3):
        raise UnreadableGGUF(f"{file.name} is GGUF version {version}, which this reader does not know (2 or 3)")
    if tensor_count > MAX_HEADER_ITEMS or metadata_count > MAX_HEADER_ITEMS:
        raise UnreadableGGUF(f"{file.name} has a corrupt header (impossible counts)")
    metadata: dict[str, object] = {}
    tokens: list[str] = []
    for _ in range(metadata_count):
        key = _read_string(file)
        value_type = GGUFValueType(_unpack(file, "<I")[0])
        if value_type == GGUFValueType.ARRAY:
            kept = _read_array(file, keep=key == Keys.Tokenizer.LIST)
            if kept is not None:
                tokens = kept
        else:
            metadata[key] = _read_scalar(file, value_type)
    parameters = 0
    for _ in range(tensor_count):
        _read_string(file)  # its name
        (dimensions,) = _unpack(file, "<I")
        if dimensions > 8:
            raise UnreadableGGUF(f"{file.name} has a corrupt tensor table")
        elements = 1
        for dimension in _unpack(file, f"<{dimensions}Q"):
            elements *= dimension
        parameters += elements
        _unpack(file, "<IQ")  # its type and data offset
    return GGUFHeader(metadata, tokens, parameters)


def _read_array(file: BinaryIO, keep: bool) -> list[str] | None:
    element_type = GGUFValueType(_unpack(file, "<I")[0])
    (count,) = _unpack(file, "<Q")
    if count > MAX_HEADER_ITEMS:
        raise UnreadableGGUF(f"{file.name} has a corrupt header (an impossibly long array)")
    if element_type in SCALAR_FORMATS:
        file.seek(count * struct.calcsize(SCALAR_FORMATS[element_type]), 1)
        return None
    if element_type == GGUFValueType.STRING:
        if keep:
            return [_read_string(file) for _ in range(count)]
        for _ in range(count):
            file.seek(_unpack(file, "<Q")[0], 1)
        return None
    for _ in range(count):  # arrays of arrays
        _read_array(file, keep=False)
    return None


def _read_scalar(file: BinaryIO, value_type: GGUFValueType) -> object:
    if value_type == GGUFValueType.STRING:
        return _read_string(file)
    return _unpack(file, SCALAR_FORMATS[value_type])[0]


def _read_string(file: BinaryIO) -> str:
    (length,) = _unpack(file, "<Q")
    if length > MAX_HEADER_ITEMS:
        raise UnreadableGGUF(f"{file.name} has a corrupt header (an impossibly long string)")
    data = file.read(length)
    if len(data) < length:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _unpack(file: BinaryIO, layout: str) -> tuple:
    size = struct.calcsize(layout)
    data = file.read(size)
    if len(data) < size:
        raise EOFError
    return struct.unpack(layout, data)
