"""Training data the target writes itself: its replies to shipped prompts, with its top-k
log-probabilities at every reply position, so the draft can learn the target's whole
distribution and not only the tokens it happened to sample.

Data is written in shards of one generation batch each. Every batch's prompts and random
seed follow from its index alone, so an interrupted run regenerates exactly what it lost and
a finished shard is never written twice.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from ..chat_prompt import Message, encode_conversation
from ..errors import TandemError
from ..models import LoadedModel
from ..sampling import Sampler

SHARD_FORMAT = 1
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
    batch_size: int = 32
    seed: int = 0


@dataclass
class Sequence:
    """One prompt and the target's reply, with the target's view of every reply token."""

    token_ids: torch.Tensor  # (P + L,) int32: chat-formatted prompt, then the reply
    prompt_length: int  # P
    top_ids: torch.Tensor  # (L, k) int32: the target's best k tokens before each reply token
    top_logprobs: torch.Tensor  # (L, k) float16: their log-probabilities at temperature 1

    @property
    def reply_length(self) -> int:
        return self.top_ids.shape[0]

    def to_dict(self) -> dict[str, Any]:
        return {
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


def generate_split(
    target: LoadedModel,
    prompts: list[str],
    folder: Path,
    name: str,
    token_budget: int,
    settings: GenerationSettings,
    should_stop: StopCheck,
    on_tokens: TokenProgress,
) -> bool:
    """Write shards `name-NNNNN.pt` into `folder` until they hold `token_budget` reply tokens.

    Shards already there are kept. Returns False when `should_stop` asked to stop first; the
    batch in progress is then dropped (it is regenerated identically on resume).
    """
    folder.mkdir(parents=True, exist_ok=True)
    existing = shard_paths(folder, name)
    collected = sum(sequence.reply_length for path in existing for sequence in load_shard(path))
    on_tokens(collected)
    stop_ids = stop_token_ids(target)
    pad_id = pad_token_id(target.tokenizer, stop_ids)
    # A different base per split, so held-out replies are not the training replies' twins.
    seed_base = settings.seed * 1_000_003 + (0 if name == "train" else 500_009)
    batch_index = len(existing)
    while collected < token_budget:
        if should_stop():
            return False
        first = batch_index * settings.batch_size
        batch_prompts = [prompts[(first + offset) % len(prompts)] for offset in range(settings.batch_size)]
        prompt_ids = [encode_conversation(target.tokenizer, [Message("user", prompt)]) for prompt in batch_prompts]
        generator = torch.Generator().manual_seed(seed_base + batch_index)
        sequences = sample_replies(target, prompt_ids, settings, stop_ids, pad_id, generator, should_stop)
        if sequences is None:
            return False
        save_shard(folder / f"{name}-{batch_index:05d}.pt", sequences)
        new_tokens = sum(sequence.reply_length for sequence in sequences)
        collected += new_tokens
        on_tokens(new_tokens)
        batch_index += 1
    return True


@torch.inference_mode()
def sample_replies(
    target: LoadedModel,
    prompt_ids: list[list[int]],
    settings: GenerationSettings,
    stop_ids: frozenset[int],
    pad_id: int,
    generator: torch.Generator,
    should_stop: StopCheck,
) -> list[Sequence] | None:
    """Sample one reply per prompt in one left-padded batch; None if stopped midway."""
    model, device = target.model, target.device
    batch, width = len(prompt_ids), max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): each prompt starts at 0
    cache = DynamicCache(config=model.config)
    sampler = Sampler(temperature=settings.temperature)
    stop_tensor = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    usable_vocab = min(len(target.tokenizer), model.config.vocab_size)

    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=cache, use_cache=True, logits_to_keep=1,
    ).logits[:, -1]  # (B, V)
    next_position = position_ids[:, -1:] + 1  # (B, 1)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, top_ids, top_logprobs = [], [], []
    for step in range(settings.max_new_tokens):
        if should_stop():
            return None
        # Embedding rows past the tokenizer are padding and must never be sampled.
        logits = logits.float()[:, :usable_vocab]
        logprobs = torch.log_softmax(logits, dim=-1)  # temperature 1: the distribution to learn
        best = torch.topk(logprobs, settings.stored_top_k, dim=-1)
        probs = sampler.probabilities(logits).cpu()
        token = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(device)  # (B,)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens.append(token.cpu())
        top_ids.append(best.indices.cpu())
        top_logprobs.append(best.values.cpu())
        finished |= torch.isin(token, stop_tensor)
        if bool(finished.all()) or step + 1 == settings.max_new_tokens:
            break
        attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)
        logits = model(
            input_ids=token[:, None], attention_mask=attention_mask, position_ids=next_position,
            past_key_values=cache, use_cache=True,
        ).logits[:, -1]
        next_position = next_position + 1
    return _sequences(prompt_ids, torch.stack(tokens, 1), torch.stack(top_ids, 1), torch.stack(top_logprobs, 1), stop_ids)


def _sequences(
    prompt_ids: list[list[int]],
    tokens: torch.Tensor,  # (B, S)
    top_ids: torch.Tensor,  # (B, S, k)
    top_logprobs: torch.Tensor,  # (B, S, k)
    stop_ids: frozenset[int],
) -> list[Sequence]:
    """Cut each row of a batch after its first stop token (kept: the draft must learn to stop)."""
    sequences = []
    for row, prompt in enumerate(prompt_ids):
        reply = tokens[row].tolist()
        length = next((index + 1 for index, token in enumerate(reply) if token in stop_ids), len(reply))
        sequences.append(
            Sequence(
                token_ids=torch.tensor(prompt + reply[:length], dtype=torch.int32),
                prompt_length=len(prompt),
                top_ids=top_ids[row, :length].to(torch.int32),
                top_logprobs=top_logprobs[row, :length].to(torch.float16),
            )
        )
    return sequences


def stop_token_ids(target: LoadedModel) -> frozenset[int]:
    """Every id the target's configs and tokenizer call end-of-sequence."""
    ids: set[int] = set()
    for source in (target.model.generation_config, target.model.config, target.tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(token_id) for token_id in eos)
    if not ids:
        raise TandemError("The target names no end-of-sequence token, so its replies would never end.")
    return frozenset(ids)


def pad_token_id(tokenizer: Any, stop_ids: frozenset[int]) -> int:
    # Padding is masked out everywhere; any id will do, and a stop id always exists.
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else min(stop_ids)


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
