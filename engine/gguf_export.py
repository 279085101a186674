"""`tandem export-gguf DIR`: a Hugging Face Llama-architecture folder (a distilled draft,
say) written as a GGUF file beside its weights, so that the llama.cpp runtime can run it.

The tensors get llama.cpp's names; the query and key projections are permuted from the
rotate-half layout transformers uses to the interleaved one llama.cpp's Llama expects. The
vocabulary is written from tokenizer.json (byte-level BPE), which llama.cpp needs to load
the file, although Tandem always passes it token ids.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from .errors import ModelLoadError

PRECISIONS = {"f16": "F16", "q8_0": "Q8_0", "f32": "F32"}
DEFAULT_PRECISION = "q8_0"
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def gguf_path_for(folder: Path, precision: str = DEFAULT_PRECISION) -> Path:
    return folder / f"model.{precision}.gguf"


def export_gguf(folder: Path, out: Path | None = None, precision: str = DEFAULT_PRECISION) -> Path:
    """Write `folder`'s model as GGUF to `out` (default: beside its weights); atomically, so
    a killed export leaves no half-written file."""
    import gguf
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = _read_config(folder)
    out = out or gguf_path_for(folder, precision)
    weights_file = folder / "model.safetensors"
    try:
        tensors = load_file(str(weights_file))
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        raise ModelLoadError(f"Could not read the weights of {folder}: {error}") from error
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer_path = Path(tempfile.mkstemp(prefix=f".{out.name}.partial-", dir=out.parent)[1])
    try:
        writer = gguf.GGUFWriter(str(writer_path), "llama")
        writer.add_name(folder.name)
        writer.add_context_length(config.get("max_position_embeddings", 2048))
        writer.add_embedding_length(config["hidden_size"])
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
        writer.add_file_type({"f16": 1, "q8_0": 7, "f32": 0}[precision])
        embedding_rows = tensors["model.embed_tokens.weight"].shape[0]
        writer.add_vocab_size(embedding_rows)
        _add_vocabulary(writer, folder, embedding_rows)
        for name, tensor in _llama_tensors(tensors, config, heads, kv_heads):
            writer.add_tensor(name, *_encoded(tensor, precision, gguf))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(writer_path, out)
    finally:
        if writer_path.exists():
            writer_path.unlink()
    return out


def _read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{folder} has no readable config.json: {error}") from error
    if config.get("model_type") != "llama":
        raise ModelLoadError(f"{folder} is a {config.get('model_type')!r} model; GGUF export handles the Llama architecture only")
    return config


def _llama_tensors(tensors: dict[str, torch.Tensor], config: dict, heads: int, kv_heads: int):
    yield "token_embd.weight", tensors["model.embed_tokens.weight"]
    for layer in range(config["num_hidden_layers"]):
        for hf_name, gguf_name in LAYER_NAMES.items():
            tensor = tensors[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                tensor = _rotate_half_to_interleaved(tensor, heads)
            elif gguf_name == "attn_k":
                tensor = _rotate_half_to_interleaved(tensor, kv_heads)
            yield f"blk.{layer}.{gguf_name}.weight", tensor
    yield "output_norm.weight", tensors["model.norm.weight"]
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        yield "output.weight", tensors["lm_head.weight"]


def _rotate_half_to_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers rotates the two halves of each head's dimensions; llama.cpp's Llama
    rotates neighbouring pairs. Reorder the rows so both compute the same attention."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _encoded(tensor: torch.Tensor, precision: str, gguf) -> tuple:
    array = tensor.float().numpy()
    if array.ndim == 1 or precision == "f32":  # norms stay exact: they are tiny
        return (array.astype(np.float32),)
    if precision == "f16":
        return (array.astype(np.float16),)
    quantised = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
    return quantised, quantised.shape, gguf.GGMLQuantizationType.Q8_0


def _add_vocabulary(writer, folder: Path, rows: int) -> None:
    try:
        tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{folder} has no readable tokenizer.json: {error}") from error
    model = tokenizer.get("model", {})
    if model.get("type") != "BPE":
        raise ModelLoadError(f"{folder}'s tokenizer is {model.get('type')!r}; GGUF export handles byte-level BPE tokenizers only")
    tokens = [f"[PAD{index}]" for index in range(rows)]
    types = [TOKEN_UNUSED] * rows
    for token, index in model["vocab"].items():
        if index < rows:
            tokens[index], types[index] = token, TOKEN_NORMAL
    for added in tokenizer.get("added_tokens", []):
        if added["id"] < rows:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    settings = _tokenizer_settings(folder)
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id), ("pad_token", writer.add_pad_token_id)):
        name = settings.get(key)
        if isinstance(name, dict):
            name = name.get("content")
        if name in tokens:
            add(tokens.index(name))
    writer.add_add_bos_token(False)  # Tandem's chat prompts carry their own special tokens


def _tokenizer_settings(folder: Path) -> dict:
    try:
        return json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def add_export_gguf_command(commands) -> None:
    parser = commands.add_parser("export-gguf", help="write a Llama-architecture model folder as GGUF, for the llama.cpp runtime")
    parser.add_argument("folder", type=Path, help="a Hugging Face folder (config.json, model.safetensors, tokenizer.json)")
    parser.add_argument("--out", type=Path, help="the GGUF file to write (default: FOLDER/model.PRECISION.gguf)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default=DEFAULT_PRECISION, help=f"tensor type (default: {DEFAULT_PRECISION})")
    parser.set_defaults(run=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    out = export_gguf(args.folder.expanduser(), args.out, args.precision)
    print(f"{out} ({out.stat().st_size / 2**20:.1f} MB)")
    return 0
