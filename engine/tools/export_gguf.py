"""A Llama-architecture Hugging Face folder as one GGUF file that
llama.cpp loads and runs with the same logits as transformers.

Written against the GGUF format (gguf's GGUFWriter), not adapted from llama.cpp's converter.
Only what Tandem's drafts and the Llama family need: no rope scaling, no biases, no sharding
of the output. With `--draft-for TARGET`, a draft is written for llama.cpp's own speculative
decoding instead (`gguf_draft_for_target.py`); an EAGLE-3 head's folder is written as
llama.cpp's `eagle3` draft for its target (`gguf_eagle3.py`).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize
from safetensors import SafetensorError, safe_open
from transformers import LlamaConfig

from ..errors import ModelLoadError
from .gguf_draft_for_target import TargetTokenizer, vocabulary_rows
from .gguf_vocab import read_vocabulary
from ..runtime.reduced_vocabulary import ReducedVocabulary

PRECISIONS = ("f16", "bf16", "f32", "q8_0")
DEFAULT_PRECISION = "f16"
# What `tandem distill` writes beside a draft: the fastest on a 2-core CPU for the demo draft
# (0.68 ms a token against 1.06 ms for f16; the output matrix dominates a small draft) and the smallest.
DRAFT_PRECISION = "q8_0"
FILE_TYPES = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
}
Q8_0_BLOCK = 32  # values per Q8_0 block: a row must be a whole number of blocks
DISTILLED_TARGET = ""  # `--draft-for` without a value: the target named in the draft's distillation report

# Hugging Face name inside `model.layers.N.` → GGUF name inside `blk.N.`
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


class GGUFExportError(ModelLoadError):
    """A folder that cannot be exported to GGUF (wrong architecture, missing or unreadable files)."""


@dataclass(frozen=True)
class LlamaShape:
    """The hyperparameters llama.cpp reads from `llama.*` keys."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    rms_norm_eps: float
    rope_theta: float
    tied_embeddings: bool


def default_output_path(folder: Path, precision: str, target: Path | None = None) -> Path:
    """Beside the weights, where Tandem finds it; a draft for a llama.cpp target in the current
    folder instead: Tandem takes the first GGUF beside a draft's weights as the draft in its own
    ids, and a model folder inside an installed package may be read-only."""
    if target is not None:
        return Path.cwd() / f"{folder.resolve().name}-for-{target.stem}.{precision}.gguf"
    return folder / f"model.{precision}.gguf"


def export_gguf(
    folder: Path, out_path: Path | None = None, precision: str = DEFAULT_PRECISION, draft_for: Path | None = None
) -> Path:
    """Write the model in `folder` to `out_path` (default: `default_output_path`) and return that path.

    With `draft_for` (a target GGUF file) the model is written as a draft that llama.cpp's
    speculative decoding pairs with that target: the target's tokenizer metadata and a row for
    each of its tokens. The file appears whole or not at all: it is written under a temporary
    name and renamed.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown GGUF precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    folder = Path(folder).expanduser()
    out_path = Path(out_path).expanduser() if out_path else default_output_path(folder, precision, draft_for)
    shape = read_shape(folder)
    with ExitStack() as stack:
        weights = _open_weights(folder, stack)
        tied = shape.tied_embeddings or "lm_head.weight" not in weights
        embedding_rows = weights.shape("model.embed_tokens.weight")[0]
        reduced = ReducedVocabulary.load(folder)
        full_vocabulary = read_vocabulary(folder, reduced.full_size if reduced else embedding_rows)
        rows = None  # (input, output) rows over the target's vocabulary, for a draft paired with one
        if draft_for is not None:
            target_tokenizer = TargetTokenizer.read(draft_for)
            target_tokenizer.check_matches(full_vocabulary, folder)
            embedding = weights.get("model.embed_tokens.weight")
            output = embedding if tied else weights.get("lm_head.weight")
            rows = vocabulary_rows(embedding, output, reduced, target_tokenizer.size)
            vocabulary, vocab_size = target_tokenizer, target_tokenizer.size
        elif reduced is None:
            vocabulary, vocab_size = full_vocabulary, embedding_rows
        else:
            vocabulary, vocab_size = full_vocabulary.restricted(reduced.kept_ids), embedding_rows

        def write(partial: Path) -> None:
            writer = GGUFWriter(partial, arch="llama")
            add_model_metadata(writer, folder, shape, vocab_size, precision)
            vocabulary.write_to(writer)
            write_tensors_and_close(writer, _gguf_tensors(weights, shape, tied, rows), precision)

        write_atomically(out_path, write)
    return out_path


# 1. the model's shape


def read_shape(folder: Path) -> LlamaShape:
    config_path = folder / "config.json"
    if not folder.is_dir():
        raise GGUFExportError(f"Model folder not found: {folder}")
    if not config_path.is_file():
        raise GGUFExportError(f"{folder} is not a Hugging Face model folder: it has no config.json.")
    try:
        model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise GGUFExportError(f"Could not read {config_path}: {error}") from error
    if model_type != "llama":
        raise GGUFExportError(
            f"{folder} holds a {model_type or 'model of unknown type'} model; GGUF export supports "
            "the Llama architecture (model_type \"llama\") only."
        )
    config = LlamaConfig.from_pretrained(folder)
    # transformers 5 keeps rope_theta in rope_parameters; earlier versions on the config itself.
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise GGUFExportError(f"{folder} uses {rope['rope_type']} rope scaling, which GGUF export does not support.")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise GGUFExportError(f"{folder} has bias terms in its layers, which GGUF export does not support.")
    heads = config.num_attention_heads
    return LlamaShape(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=heads,
        kv_heads=config.num_key_value_heads or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        context_length=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        tied_embeddings=bool(config.tie_word_embeddings),
    )


def add_model_metadata(writer: GGUFWriter, folder: Path, shape: LlamaShape, vocab_size: int, precision: str) -> None:
    writer.add_name(folder.resolve().name)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_dimension_count(shape.head_dim)
    if shape.head_dim != shape.hidden // shape.heads:  # llama.cpp assumes hidden / heads otherwise
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(FILE_TYPES[precision])
    if precision == "q8_0":
        writer.add_quantization_version(GGML_QUANT_VERSION)


# 2. the weights


class _Weights:
    """The tensors of every safetensors file in a folder, by name, read one at a time."""

    def __init__(self, folder: Path, files: dict[str, Any]):
        self.folder = folder
        self.files = files  # tensor name → open safetensors file

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def shape(self, name: str) -> list[int]:
        return list(self._file(name).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._file(name).get_tensor(name).to(torch.float32)
        except (SafetensorError, OSError, RuntimeError) as error:
            raise GGUFExportError(f"Could not read {name} from the weights in {self.folder}: {error}") from error

    def _file(self, name: str) -> Any:
        if name not in self.files:
            raise GGUFExportError(f"The weights in {self.folder} lack {name}: is it a Llama causal LM?")
        return self.files[name]


def _open_weights(folder: Path, stack: ExitStack) -> _Weights:
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise GGUFExportError(f"{folder} has no .safetensors weights to export.")
    files: dict[str, Any] = {}
    for path in paths:
        try:
            opened = stack.enter_context(safe_open(str(path), framework="pt"))
        except (SafetensorError, OSError) as error:
            raise GGUFExportError(f"Could not read the weights {path}: {error}") from error
        files.update((name, opened) for name in opened.keys())
    return _Weights(folder, files)


def _gguf_tensors(
    weights: _Weights, shape: LlamaShape, tied: bool, paired_rows: tuple[torch.Tensor, torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, fp32 tensor) pairs in llama.cpp's layout, one tensor read at a time.
    `paired_rows` (input, output), where given, replace the embedding and output layer, always written apart."""
    yield "token_embd.weight", paired_rows[0] if paired_rows else weights.get("model.embed_tokens.weight")
    for layer in range(shape.layers):
        yield from layer_tensors(layer, lambda name: weights.get(f"model.layers.{layer}.{name}"), shape)
    yield "output_norm.weight", weights.get("model.norm.weight")
    if paired_rows:
        yield "output.weight", paired_rows[1]
    elif not tied:  # llama.cpp reuses token_embd as the output layer when output.weight is absent
        yield "output.weight", weights.get("lm_head.weight")


def layer_tensors(
    layer: int, read: Callable[[str], torch.Tensor], shape: LlamaShape
) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, fp32 tensor) pairs of decoder layer `layer`, in llama.cpp's layout; `read`
    gives a tensor by its Hugging Face name inside the layer (`self_attn.q_proj.weight`)."""
    for hf_name, gguf_name in LAYER_TENSORS.items():
        tensor = read(hf_name)
        if gguf_name == "attn_q.weight":
            tensor = interleave_rotary_halves(tensor, shape.heads)
        elif gguf_name == "attn_k.weight":
            tensor = interleave_rotary_halves(tensor, shape.kv_heads)
        yield f"blk.{layer}.{gguf_name}", tensor


def interleave_rotary_halves(projection: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder a Q or K projection's output rows from transformers' rotary layout to llama.cpp's.

    transformers rotates dimension i of a head with dimension i + head_dim/2 ("rotate half");
    llama.cpp's llama graph rotates adjacent pairs (2i, 2i+1). Moving row i + head_dim/2 next to
    row i makes both compute the same attention scores.
    """
    rows, columns = projection.shape
    half = rows // heads // 2
    return projection.reshape(heads, 2, half, columns).transpose(1, 2).reshape(rows, columns)  # (rows, columns)


def _encoded(tensor: torch.Tensor, precision: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    """The tensor's bytes in the GGUF type `precision` asks for; norms (1-D) stay in F32,
    since llama.cpp adds and multiplies them in F32 anyway and they are tiny. Integer tensors
    (token id maps) are stored as 64-bit integers whatever the precision."""
    if not tensor.is_floating_point():
        return tensor.to(torch.int64).numpy(), GGMLQuantizationType.I64
    if tensor.ndim == 1 or precision == "f32":
        return tensor.numpy(), GGMLQuantizationType.F32
    if precision == "bf16":  # numpy has no bfloat16: hand over its bits
        return tensor.to(torch.bfloat16).view(torch.int16).numpy(), GGMLQuantizationType.BF16
    if precision == "q8_0" and tensor.shape[-1] % Q8_0_BLOCK == 0:
        return quantize(tensor.numpy(), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    return tensor.to(torch.float16).numpy(), GGMLQuantizationType.F16


# 3. the file


def write_tensors_and_close(
    writer: GGUFWriter, tensors: Iterable[tuple[str, torch.Tensor]], precision: str
) -> None:
    """Add `tensors` (GGUF name, fp32 or integer tensor), encoded for `precision`, after the
    metadata already on `writer`, and write the whole file."""
    for name, tensor in tensors:
        data, tensor_type = _encoded(tensor, precision)
        writer.add_tensor(name, data, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_atomically(out_path: Path, write: Callable[[Path], None]) -> None:
    """`write` into a hidden temporary file beside `out_path`, then rename it: a killed export
    leaves at most a `.partial` file, never a truncated GGUF that looks finished."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial_name = tempfile.mkstemp(dir=out_path.parent, prefix=f".{out_path.name}.", suffix=".partial")
    os.close(handle)
    partial = Path(partial_name)
    try:
        write(partial)
        partial.chmod(0o644)  # mkstemp's 0600 would make the shipped file private
        os.replace(partial, out_path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
