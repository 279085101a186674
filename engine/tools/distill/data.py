"""Training data the target writes itself: its replies to shipped prompts, with its top-k
log-probabilities at every reply position, so the draft can learn the target's whole
distribution and not only the tokens it happened to sample.

Data is written in shards of finished replies. Every reply's prompt and random seed follow
from its key alone, so an interrupted run regenerates exactly what it lost and a finished
reply is never written twice. Replies come from a `ReplyWriter`: `writer.BatchReplyWriter`
over whichever runtime's sequence batch suits the target.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...chat_prompt import Message, encode_conversation
from ...errors import TandemError
from ...models import LoadedModel
from .replies import Job, Reply, ReplyWriter

SHARD_FORMAT = 2  # 2: sequences carry their reply key
SHARD_SEQUENCES = 256  # replies per shard: a stopped run loses at most what was still running
# Every tenth prompt is kept out of training, so held-out scores measure replies to prompts
# the draft has never seen, not merely other samples of the same replies.
HELDOUT_EVERY = 10

StopCheck = Callable[[], bool]
TokenProgress = Callable[[int], None]  # called with the number of new reply tokens


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 256
    # Moderate temperature: varied replies that still look like what the target says at 0.
    temperature: float = 0.7
    # How many of the target's best log-probs are kept per position. SmolLM2's top 32 hold
    # nearly all of its probability at almost every position; 6 bytes each on disk.
    stored_top_k: int = 32
    batch_size: int = 64  # replies written at once
    seed: int = 0


@dataclass
class Sequence:
    """One prompt and the target's reply, with the target's view of every reply token."""

    key: int  # which reply of the run this is (see generate_split)
    token_ids: torch.Tensor  # (P + L,) int32: chat-formatted prompt, then the reply
    prompt_length: int  # P
    top_ids: torch.Tensor  # (L, k) int32: the target's best k tokens before each reply token
    top_logprobs: torch.Tensor  # (L, k) float16: their log-probabilities at temperature 1

    @property
    def reply_length(self) -> int:
        return self.top_ids.shape[0]

    @classmethod
    def from_reply(cls, reply: Reply) -> Sequence:
        return cls(
            key=reply.key,
            token_ids=torch.tensor(reply.prompt_ids + reply.reply_ids, dtype=torch.int32),
            prompt_length=len(reply.prompt_ids),
            top_ids=reply.top_ids.to(torch.int32),
            top_logprobs=reply.top_logprobs.to(torch.float16),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "token_ids": self.token_ids,
            "prompt_length": self.prompt_length,
            "top_ids": self.top_ids,
            "top_logprobs": self.top_logprobs,
        }


def split_prompts(prompts: list[str]) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts); both non-empty when there are two or more."""
    heldout = [prompt for index, prompt in enumerate(prompts) if index % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    train = [prompt for index, prompt in enumerate(prompts) if index % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    if not heldout and len(prompts) > 1:
        heldout, train = train[-1:], train[:-1]
    return train, heldout


@dataclass
class SplitOutcome:
    complete: bool  # False: asked to stop first
    sampled_mass: float | None  # mean probability the sampled-from tokens held (None: nothing new)


def generate_split(
    writer: ReplyWriter,
    tokenizer: Any,
    prompts: list[str],
    folder: Path,
    name: str,
    token_budget: int,
    settings: GenerationSettings,
    stop_ids: frozenset[int],
    should_stop: StopCheck,
    on_tokens: TokenProgress,
) -> SplitOutcome:
    """Write shards `name-NNNNN.pt` into `folder` until they hold `token_budget` reply tokens.

    Reply `key` answers prompt `key % len(prompts)` with random seed `seed_base + key`, so a
    resumed run writes exactly the replies that are missing (those that were still running
    when it stopped) and never one twice. Shards already there are kept.
    """
    folder.mkdir(parents=True, exist_ok=True)
    existing = shard_paths(folder, name)
    done: set[int] = set()
    collected = 0
    for path in existing:
        for sequence in load_shard(path):
            done.add(sequence.key)
            collected += sequence.reply_length
    on_tokens(collected)
    longest_prompt = writer.sequence_tokens - settings.max_new_tokens
    encoded = [encode_conversation(tokenizer, [Message("user", prompt)]) for prompt in prompts]
    usable = [ids for ids in encoded if len(ids) <= longest_prompt]
    if not usable:
        raise TandemError(f"None of the {len(prompts)} prompts fits in {longest_prompt} tokens beside a {settings.max_new_tokens}-token reply.")
    # A different base per split, so held-out replies are not the training replies' twins.
    seed_base = settings.seed * 1_000_003 + (0 if name == "train" else 500_009)
    total = {"tokens": collected}

    def jobs() -> Iterator[Job]:
        key = 0
        while total["tokens"] < token_budget:
            if key not in done:
                yield Job(key, usable[key % len(usable)], torch.Generator().manual_seed(seed_base + key))
            key += 1

    shard_index, pending, masses = len(existing), [], []
    replies = writer.write(jobs(), settings.max_new_tokens, settings.temperature, settings.stored_top_k, stop_ids, should_stop)
    for reply in replies:
        pending.append(Sequence.from_reply(reply))
        masses.append(reply.sampled_mass)
        total["tokens"] += len(reply.reply_ids)
        on_tokens(len(reply.reply_ids))
        if len(pending) == SHARD_SEQUENCES:
            save_shard(folder / f"{name}-{shard_index:05d}.pt", pending)
            shard_index, pending = shard_index + 1, []
    if pending:  # finished replies are kept even when the run was asked to stop
        save_shard(folder / f"{name}-{shard_index:05d}.pt", pending)
    return SplitOutcome(total["tokens"] >= token_budget, sum(masses) / len(masses) if masses else None)


def stop_token_ids(target: LoadedModel) -> frozenset[int]:
    """Every id the target's configs and tokenizer call end-of-sequence."""
    ids = target.stop_token_ids
    if not ids:
        raise TandemError("The target names no end-of-sequence token, so its replies would never end.")
    return ids


# Shards on disk


def shard_paths(folder: Path, name: str) -> list[Path]:
    """The shards of one split in order; a gap means a shard was lost, which resuming cannot mend."""
    paths = sorted(folder.glob(f"{name}-*.pt"))
    for index, path in enumerate(paths):
        if path.stem != f"{name}-{index:05d}":
            raise TandemError(f"{folder} is missing the data shard {name}-{index:05d}.pt; start a new run.")
    return paths


def save_shard(path: Path, sequences: list[Sequence]) -> None:
    # Written under another name and renamed: a shard that exists is always complete.
    partial = path.with_suffix(".partial")
    torch.save({"format": SHARD_FORMAT, "sequences": [sequence.to_dict() for sequence in sequences]}, partial)
    os.replace(partial, path)


def load_shard(path: Path) -> list[Sequence]:
    try:
        content = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError) as error:
        raise TandemError(f"Cannot read the data shard {path}: {error}. Delete it and resume.") from error
    if content.get("format") != SHARD_FORMAT:
        raise TandemError(f"{path} was written by another version of Tandem; start a new run.")
    return [Sequence(**sequence) for sequence in content["sequences"]]


def load_split(folder: Path, name: str) -> list[Sequence]:
    return [sequence for path in shard_paths(folder, name) for sequence in load_shard(path)]
