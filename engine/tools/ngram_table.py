"""`tandem ngram-table`: the background table of the second-stage n-gram model, built from
replies the draft model writes itself (ALGORITHMS.md §3b: the paper sampled its trigram
table from the draft). The table goes into the draft's folder, where pairs find it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..prompts import DISTILL_PROMPTS, read_prompts
from ..chat_prompt import Message, encode_conversation
from ..config import DEVICES, ModelSpec
from .distill.data import GenerationSettings, stop_token_ids
from .distill.replies import Job
from .distill.writer import BatchReplyWriter, torch_batch
from ..models import LoadedModel, load_model
from ..drafters.backoff_ngram import TABLE_FILE, NgramCounts

DEFAULT_TABLE_TOKENS = 200_000
# Trigram entries seen once are mostly noise; dropping them keeps the shipped file small.
MIN_TRIGRAM_COUNT = 2


def build_table(
    draft: LoadedModel, prompts: list[str], tokens: int, temperature: float = 0.8, seed: int = 0, progress=lambda n: None
) -> tuple[NgramCounts, int]:
    """Count the n-grams of the draft's sampled replies to `prompts` until `tokens` reply
    tokens; returns the pruned counts and the number of tokens counted."""
    settings = GenerationSettings(temperature=temperature, stored_top_k=1, seed=seed)
    writer = BatchReplyWriter(torch_batch(draft, settings.batch_size))
    encoded = [encode_conversation(draft.tokenizer, [Message("user", prompt)]) for prompt in prompts]
    counts = NgramCounts()
    counted = 0

    def jobs():
        key = 0
        while counted < tokens:
            yield Job(key, encoded[key % len(encoded)], torch.Generator().manual_seed(seed * 1_000_003 + key))
            key += 1

    for reply in writer.write(jobs(), settings.max_new_tokens, temperature, 1, stop_token_ids(draft)):
        # The prompt's last two tokens give the reply's first tokens their histories.
        counts.add(reply.prompt_ids + reply.reply_ids, start=len(reply.prompt_ids))
        counted += len(reply.reply_ids)
        progress(len(reply.reply_ids))
    counts.prune(MIN_TRIGRAM_COUNT)
    return counts, counted


def add_ngram_table_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ngram-table",
        help="build the second-stage n-gram table of a draft model from its own replies",
        description="Let the draft answer the shipped prompts and count its trigrams; the table is "
        f"written into the draft's folder as {TABLE_FILE}, where `staged` and `ngram` decoding find it.",
    )
    parser.add_argument("--draft", required=True, help="the draft model's folder")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TABLE_TOKENS, help=f"reply tokens to count (default: {DEFAULT_TABLE_TOKENS:,})")
    parser.add_argument("--prompts", type=Path, default=DISTILL_PROMPTS, help="JSON Lines file with a \"prompt\" key per line")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run_ngram_table)


def run_ngram_table(args: argparse.Namespace) -> int:
    folder = Path(args.draft).expanduser().resolve()
    draft = load_model(ModelSpec(str(folder), "auto", args.device), runtime="torch", as_draft=True)  # batched sampling reads the torch model
    prompts = read_prompts(args.prompts)
    with tqdm(total=args.tokens, unit="tok", unit_scale=True, desc="draft replies", file=sys.stderr) as bar:
        counts, counted = build_table(draft, prompts, args.tokens, seed=args.seed, progress=bar.update)
    path = folder / TABLE_FILE
    counts.save(path)
    entries = sum(len(counter) for counter in counts.after.values())
    print(f"{entries:,} n-gram entries from {counted:,} draft tokens written to {path} ({path.stat().st_size / 2**20:.1f} MB)")
    return 0
