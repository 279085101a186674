"""The tokenizer half of a GGUF export: a Hugging Face byte-level BPE tokenizer as llama.cpp's
`tokenizer.ggml.*` metadata.

Tandem hands llama.cpp token ids and never lets it tokenize, but llama.cpp will not load a
model without a vocabulary it understands, and a GGUF file is also meant to run elsewhere.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFWriter, TokenType
from transformers import AutoTokenizer

from ..errors import ModelLoadError

# llama.cpp splits text into words with a regex chosen by `tokenizer.ggml.pre`. SmolLM's
# tokenizer (shared by SmolLM, SmolLM2 and their converted copies, whose tokenizer.json may
# have lost the original pre-tokenizer) is recognised by its token list, the way llama.cpp's
# converter recognises tokenizers by a digest of what they produce.
SMOLLM_TOKENS_SHA256 = "d1f2ce856b324081b621d9e2e8dbd22879f462329f3fd4aa39fa758dddb2ce55"
SMOLLM_PRE = "smollm"
DEFAULT_PRE = "default"
OTHER_TOKEN = "<|tandem_other|>"  # a reduced draft's one id for every token it does not keep


class UnsupportedTokenizerError(ModelLoadError):
    """A tokenizer that the GGUF exporter cannot describe to llama.cpp."""


@dataclass
class GGUFVocabulary:
    """What llama.cpp needs to load a "gpt2" (byte-level BPE) vocabulary."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    special_ids: dict[str, int] = field(default_factory=dict)  # "bos", "eos", "pad", "unk"
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None

    def write_to(self, writer: GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        writer.add_token_merges(self.merges)
        adders = {
            "bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
            "pad": writer.add_pad_token_id, "unk": writer.add_unk_token_id,
        }
        for role, token_id in self.special_ids.items():
            adders[role](token_id)
        writer.add_add_bos_token(self.add_bos)
        writer.add_add_eos_token(self.add_eos)
        if self.chat_template:
            writer.add_chat_template(self.chat_template)


    def restricted(self, kept_ids: tuple[int, ...]) -> GGUFVocabulary:
        """The vocabulary of a reduced draft (`runtime/reduced_vocabulary.py`): its kept
        tokens in its own order, then one entry for every other token. The merges stay whole:
        llama.cpp keeps them as text, and Tandem never lets it tokenize anyway."""
        position = {token: index for index, token in enumerate(kept_ids)}
        return GGUFVocabulary(
            tokens=[self.tokens[token] for token in kept_ids] + [OTHER_TOKEN],
            token_types=[self.token_types[token] for token in kept_ids] + [int(TokenType.UNUSED)],
            merges=self.merges,
            pre=self.pre,
            special_ids={role: position[token] for role, token in self.special_ids.items() if token in position},
            add_bos=self.add_bos,
            add_eos=self.add_eos,
            chat_template=self.chat_template,
        )


def read_vocabulary(folder: Path, embedding_rows: int) -> GGUFVocabulary:
    """The vocabulary of the tokenizer in `folder`, padded to the embedding's `embedding_rows`."""
    backend = _read_tokenizer_json(folder)
    model = backend["model"]
    if model.get("type") != "BPE":
        raise UnsupportedTokenizerError(
            f"{folder} has a {model.get('type', 'unknown')} tokenizer; GGUF export supports byte-level BPE "
            "tokenizers (model type BPE in tokenizer.json) only."
        )
    added = {entry["id"]: entry for entry in backend.get("added_tokens", [])}
    names_by_id = {token_id: name for name, token_id in model["vocab"].items()}
    names_by_id.update((token_id, entry["content"]) for token_id, entry in added.items())
    size = max(embedding_rows, max(names_by_id) + 1)
    if size > embedding_rows:
        raise ModelLoadError(
            f"{folder}: the tokenizer has ids up to {size - 1} but the embedding has only {embedding_rows} rows."
        )
    tokens, token_types = [], []
    for token_id in range(size):
        if token_id in added:
            kind = TokenType.CONTROL if added[token_id].get("special") else TokenType.USER_DEFINED
        elif token_id in names_by_id:
            kind = TokenType.NORMAL
        else:  # embedding rows past the tokenizer (or holes in it): llama.cpp needs a name per row
            kind = TokenType.UNUSED
        tokens.append(names_by_id.get(token_id, f"[PAD{token_id}]"))
        token_types.append(int(kind))

    vocabulary = GGUFVocabulary(
        tokens=tokens,
        token_types=token_types,
        merges=[_merge_line(merge) for merge in model.get("merges", [])],
        pre=SMOLLM_PRE if _tokens_digest(tokens) == SMOLLM_TOKENS_SHA256 else DEFAULT_PRE,
    )
    _add_special_token_settings(vocabulary, folder)
    return vocabulary


def _read_tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedTokenizerError(
            f"{folder} has no tokenizer.json; GGUF export needs a fast (tokenizers) BPE tokenizer."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"Could not read {path}: {error}") from error


def _merge_line(merge: str | list[str]) -> str:
    # tokenizers ≥ 0.20 saves merges as pairs; GGUF (like older tokenizer.json files) wants "a b".
    return merge if isinstance(merge, str) else " ".join(merge)


def _tokens_digest(tokens: list[str]) -> str:
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def _add_special_token_settings(vocabulary: GGUFVocabulary, folder: Path) -> None:
    """Special token ids, whether encoding adds BOS/EOS, and the chat template, as transformers
    reads them (from tokenizer_config.json, special_tokens_map.json or chat_template.jinja)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"Could not load the tokenizer in {folder}: {error}") from error
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if token_id is not None:
            vocabulary.special_ids[role] = int(token_id)
    # Asking the tokenizer is the one answer that holds for every way of configuring it
    # (add_bos_token flags, post-processor templates).
    encoded = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos, eos = vocabulary.special_ids.get("bos"), vocabulary.special_ids.get("eos")
    vocabulary.add_bos = bos is not None and len(encoded) > 1 and encoded[0] == bos
    vocabulary.add_eos = eos is not None and len(encoded) > 1 and encoded[-1] == eos
    template = getattr(tokenizer, "chat_template", None)
    vocabulary.chat_template = template if isinstance(template, str) else None
