"""An EAGLE-3 head as llama.cpp's `eagle3` GGUF, the draft of `--spec-type draft-eagle3`.

llama.cpp runs the head beside its target (`src/models/eagle3.cpp`): the target hands over the
inputs of three of its layers, the head's `fc` fuses them, and its one decoder layer drafts
over the head's reduced vocabulary. So the file holds the head's weights under llama.cpp's
names, with what the loader asks of it besides a plain Llama layer:

- `eagle3.target_layers`: the three target layers, counted as Tandem counts them (id i is the
  input of layer i, llama.cpp's `llama_set_embeddings_layer_inp`), and
  `eagle3.target_hidden_size`;
- `d2t` as absolute target ids (int64), where the published layout stores offsets
  (target id = d + d2t[d]); `t2d` has no use there and is left out;
- `hidden_norm` as `blk.0.attn_norm_2`, and Q and K reordered for llama.cpp's rotary layout
  as in any Llama layer;
- the target's own tokenizer, since the head has none and llama.cpp pairs only drafts that
  share the target's vocabulary;
- for a head with Llama 3's rope scaling, `rope_freqs` (llama.cpp's per-frequency divisors).

Written from llama.cpp's loader and the GGUF format, not adapted from its converter.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from gguf import GGUFWriter

from ..errors import ModelLoadError
from ..runtime.eagle3_head import Eagle3Head, check_fits_target, load_head
from .export_gguf import (
    DEFAULT_PRECISION, PRECISIONS, LlamaShape, add_model_metadata, default_output_path, layer_tensors,
    write_atomically, write_tensors_and_close,
)
from .gguf_draft_for_target import DraftPairingError, TargetTokenizer, read_target_gguf

ARCHITECTURE = "eagle3"  # gguf 0.19 has no MODEL_ARCH for it: keys are written by name
TARGET_LAYERS_KEY = f"{ARCHITECTURE}.target_layers"
TARGET_HIDDEN_SIZE_KEY = f"{ARCHITECTURE}.target_hidden_size"
NORM_BEFORE_RESIDUAL_KEY = f"{ARCHITECTURE}.norm_before_residual"
NORM_BEFORE_FC_KEY = f"{ARCHITECTURE}.norm_before_fc"
HIDDEN_NORM = ("hidden_norm.weight", "attn_norm_2.weight")  # the head's one norm a Llama layer lacks


def export_eagle3_gguf(
    folder: Path, target: Path, out_path: Path | None = None, precision: str = DEFAULT_PRECISION
) -> Path:
    """Write the EAGLE-3 head in `folder`, trained for the target GGUF file `target`, to
    `out_path` (default: `default_output_path`) as llama.cpp's `eagle3` draft and return that path.

    Refuses a head made for another target (another hidden size or vocabulary, layers the
    target lacks). The file appears whole or not at all.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown GGUF precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    folder, target = Path(folder).expanduser(), Path(target).expanduser()
    out_path = Path(out_path).expanduser() if out_path else default_output_path(folder, precision, target)
    target_tokenizer = TargetTokenizer.read(target)
    target_hidden, target_layers = _target_shape(target)
    head = load_head(folder, target_layers)
    try:
        check_fits_target(head, target_hidden, target_tokenizer.size, target_layers)
    except ModelLoadError as error:
        raise DraftPairingError(f"{folder} is not a head for {target}. {error}") from error
    if head.config.extra.get("norm_before_fc"):
        raise DraftPairingError(f"{folder} norms the target's features before fc, which Tandem does not run.")

    def write(partial: Path) -> None:
        writer = GGUFWriter(partial, arch=ARCHITECTURE)
        add_model_metadata(writer, folder, _llama_shape(head), target_tokenizer.size, precision)
        writer.add_array(TARGET_LAYERS_KEY, list(head.config.layer_ids))
        writer.add_uint32(TARGET_HIDDEN_SIZE_KEY, head.config.target_hidden_size)
        writer.add_bool(NORM_BEFORE_RESIDUAL_KEY, bool(head.config.extra.get("norm_before_residual", False)))
        writer.add_bool(NORM_BEFORE_FC_KEY, False)
        target_tokenizer.write_to(writer)
        write_tensors_and_close(writer, _eagle3_tensors(head), precision)

    write_atomically(out_path, write)
    return out_path


def _target_shape(target: Path) -> tuple[int, int]:
    """The target's hidden size and layer count, as its GGUF states them."""
    fields = read_target_gguf(target).fields
    architecture = fields["general.architecture"].contents() if "general.architecture" in fields else None
    try:
        return (int(fields[f"{architecture}.embedding_length"].contents()),
                int(fields[f"{architecture}.block_count"].contents()))
    except KeyError as error:
        raise DraftPairingError(f"The target GGUF {target} does not state its shape ({error.args[0]}).") from error


def _llama_shape(head: Eagle3Head) -> LlamaShape:
    config = head.config
    return LlamaShape(
        layers=1, hidden=config.hidden_size, intermediate=config.intermediate_size,
        heads=config.num_attention_heads, kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        context_length=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta, tied_embeddings=False,
    )


def _eagle3_tensors(head: Eagle3Head) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor) pairs of the head in llama.cpp's layout, with the shapes its
    `load_arch_tensors` asks for (GGUF lists them innermost first, the transpose of these)."""
    with torch.no_grad():
        layer = {name: value.float() for name, value in head.midlayer.state_dict().items()}
        yield "fc.weight", head.fc.weight.float()  # (hidden, 3 * target hidden)
        yield from layer_tensors(0, layer.__getitem__, _llama_shape(head))
        yield f"blk.0.{HIDDEN_NORM[1]}", layer[HIDDEN_NORM[0]]
        yield "output_norm.weight", head.norm.weight.float()
        yield "output.weight", head.lm_head.weight.float()  # (draft vocabulary, hidden)
        yield "d2t", head.target_ids  # (draft vocabulary,) absolute target ids, int64
        if head.embed_tokens is not None:  # otherwise llama.cpp reads the target's embedding
            yield "token_embd.weight", head.embed_tokens.weight.float()  # (target vocabulary, hidden)
        if head.config.rope_scaling:
            yield "rope_freqs.weight", _rope_frequency_factors(head)


def _rope_frequency_factors(head: Eagle3Head) -> torch.Tensor:
    """(head_dim / 2,) llama.cpp's per-frequency divisors for Llama 3's rope scaling: plain
    RoPE's inverse frequencies over the scaled ones the head runs with."""
    config = head.config
    plain = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2).float() / config.head_dim))
    return plain / head.inv_freq.float()
