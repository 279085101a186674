"""A draft GGUF that llama.cpp's speculative decoding (`llama-server -md`, LM Studio) pairs
with its target.

llama.cpp refuses a draft whose vocabulary is not the target's (`common/speculative.cpp`): the
same tokenizer type, the same BOS/EOS settings, sizes within 128 tokens of each other and the
same text for every token from id 5 on. A Tandem draft may know only part of the vocabulary
(`runtime/reduced_vocabulary.py`), and the plain export writes it in those ids, which only
Tandem can map back. For llama.cpp the draft is written over the target's whole vocabulary
instead, under the target's own tokenizer metadata, copied as stored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader, GGUFValueType, GGUFWriter, TokenType

from ..config import DEMO_TARGET
from ..demo_model import demo_gguf_path
from ..errors import ModelLoadError
from ..runtime.reduced_vocabulary import ReducedVocabulary
from .gguf_vocab import GGUFVocabulary

TOKENIZER_KEYS = "tokenizer."  # every key llama.cpp reads its vocabulary from starts so
DISTILL_REPORT = "distill-report.json"  # where `tandem distill` names the target it learned from


class DraftPairingError(ModelLoadError):
    """A draft that cannot be written for the target named (no GGUF target, another tokenizer)."""


@dataclass(frozen=True)
class TargetTokenizer:
    """The `tokenizer.*` metadata of a target GGUF file, key by key as stored."""

    path: Path
    fields: tuple[tuple[str, Any, GGUFValueType, GGUFValueType | None], ...]  # key, value, type, item type
    tokens: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.tokens)

    @classmethod
    def read(cls, path: Path) -> TargetTokenizer:
        reader = read_target_gguf(path)
        fields = []
        for key, field in reader.fields.items():
            if key.startswith(TOKENIZER_KEYS):
                item_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
                fields.append((key, field.contents(), field.types[0], item_type))
        tokens = next((value for key, value, _, _ in fields if key == "tokenizer.ggml.tokens"), None)
        if not tokens:
            raise DraftPairingError(f"The target GGUF {path} has no vocabulary (tokenizer.ggml.tokens).")
        return cls(path, tuple(fields), tuple(tokens))

    def write_to(self, writer: GGUFWriter) -> None:
        for key, value, value_type, item_type in self.fields:
            writer.add_key_value(key, value, value_type, sub_type=item_type)

    def check_matches(self, draft_vocabulary: GGUFVocabulary, folder: Path) -> None:
        """Refuse a draft whose tokenizer names a token differently from the target: its ids
        would mean other text to llama.cpp, and every draft would be rejected."""
        for token_id in range(min(self.size, len(draft_vocabulary.tokens))):
            if draft_vocabulary.token_types[token_id] == TokenType.UNUSED:
                continue  # padding rows past the draft's tokenizer name nothing
            if draft_vocabulary.tokens[token_id] != self.tokens[token_id]:
                raise DraftPairingError(
                    f"{folder} does not share the tokenizer of {self.path}: token {token_id} is "
                    f"{draft_vocabulary.tokens[token_id]!r} in the draft and {self.tokens[token_id]!r} in the target."
                )


def read_target_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (OSError, ValueError) as error:
        raise DraftPairingError(f"Could not read the target GGUF {path}: {error}") from error


def paired_target_gguf(folder: Path, named: str | None) -> Path:
    """The target GGUF a draft is written for: `named` (a .gguf file or `demo-target`), or
    else the target its distillation report names."""
    if named is None:
        named = _distilled_from(folder)
    if named == DEMO_TARGET:
        return demo_gguf_path()
    path = Path(named).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise DraftPairingError(
            f"llama.cpp pairs a draft with a GGUF target, and {named} is not a GGUF file: "
            "name the target's .gguf file with --draft-for."
        )
    return path


def _distilled_from(folder: Path) -> str:
    report = folder / DISTILL_REPORT
    try:
        return str(json.loads(report.read_text(encoding="utf-8"))["target"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise DraftPairingError(
            f"{folder} does not say which target it was distilled for ({DISTILL_REPORT}: {error}); "
            "name the target's GGUF file with --draft-for TARGET.gguf."
        ) from error


def vocabulary_rows(
    embedding: torch.Tensor, output: torch.Tensor, reduced: ReducedVocabulary | None, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's input and output rows over a `size`-token vocabulary: ((size, hidden), (size, hidden)).

    `embedding` and `output` are the draft's own rows (the same tensor when tied). A token it
    has no row for (one a reduced draft dropped, or past its embedding) is read through the
    reduced draft's shared "other" row, as Tandem reads it, or zeros for a full draft.

    Its output row is the mean of the kept tokens' rows, so its logit is the mean of theirs:
    never above the largest, so llama.cpp's draft never proposes it first unless every kept
    token ties. Zero rows would not do: a token at logit 0 is the draft's first choice wherever
    every kept logit is negative, and the llama graph has no output bias to push it lower.
    """
    hidden = embedding.shape[1]
    if reduced is None:
        kept_ids = torch.arange(min(embedding.shape[0], size))
        kept_embedding, kept_output = embedding[: len(kept_ids)], output[: len(kept_ids)]
        unknown_input = torch.zeros(hidden)
    else:
        if reduced.full_size != size:
            raise DraftPairingError(
                f"The draft keeps ids of a {reduced.full_size}-token vocabulary; the target has {size} tokens."
            )
        kept_ids = torch.tensor(reduced.kept_ids)
        kept_embedding, kept_output = embedding[: reduced.other_id], output[: reduced.other_id]
        unknown_input = embedding[reduced.other_id]
    inputs = unknown_input.expand(size, hidden).clone()  # (size, hidden)
    inputs[kept_ids] = kept_embedding
    outputs = kept_output.mean(dim=0).expand(size, hidden).clone()  # (size, hidden)
    outputs[kept_ids] = kept_output
    return inputs, outputs
