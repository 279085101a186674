"""Prompts the target writes itself, the way "Magpie" does: feed the chat template up to
the start of a user turn and let the target sample what the user says.

The shipped prompt set is a few hundred lines; millions of reply tokens need thousands of
different questions, and no dataset may be downloaded. An instruction-tuned target has seen
enough user turns to write plausible ones, in the mix of topics it was tuned on, which is
also the mix its replies should be distilled on.

Every attempt is one line of `synthetic-prompts.jsonl` (kept or not, and why), so a resumed
run neither repeats an attempt nor keeps a prompt twice; its random seed follows from its key.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ...errors import TandemError
from .replies import Job, ReplyWriter

SYNTHETIC_FILE = "synthetic-prompts.jsonl"
MAX_PROMPT_TOKENS = 96  # a user turn longer than this is cut, and an unfinished one is dropped
TEMPERATURE = 1.0  # the target's own spread of questions, not its most typical one
MIN_WORDS, MAX_WORDS = 3, 80
MARKER = "QUESTION_GOES_HERE"


def user_turn_prefix(tokenizer: Any) -> list[int]:
    """The token ids of the chat template up to where a user's words begin."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], tokenize=False)
    except (ValueError, TypeError, AttributeError) as error:
        raise TandemError(f"The target's tokenizer has no usable chat template, so it cannot write prompts: {error}") from error
    if MARKER not in text:
        raise TandemError("The target's chat template drops the user's words, so it cannot write prompts.")
    return tokenizer(text[: text.index(MARKER)], add_special_tokens=False)["input_ids"]


def synthesize_prompts(
    writer: ReplyWriter,
    tokenizer: Any,
    count: int,
    folder: Path,
    seed: int,
    stop_ids: frozenset[int],
    known: list[str],
    should_stop: Callable[[], bool],
    on_prompt: Callable[[int], None],
) -> list[str] | None:
    """`count` new prompts, deduplicated against each other and `known`, in key order;
    None when asked to stop first (what was written is kept for the next run)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SYNTHETIC_FILE
    attempts = _read_attempts(path)
    seen = {_normalised(prompt) for prompt in known}
    kept: dict[int, str] = {}
    for key, prompt in sorted(attempts.items()):
        if prompt is not None and _normalised(prompt) not in seen:
            seen.add(_normalised(prompt))
            kept[key] = prompt
    on_prompt(len(kept))
    prefix = user_turn_prefix(tokenizer)
    seed_base = seed * 1_000_003 + 900_001

    def jobs() -> Iterator[Job]:
        key = 0
        while len(kept) < count:
            if key not in attempts:
                yield Job(key, prefix, torch.Generator().manual_seed(seed_base + key))
            key += 1

    with path.open("a", encoding="utf-8") as log:
        for reply in writer.write(jobs(), MAX_PROMPT_TOKENS, TEMPERATURE, 0, stop_ids, should_stop):
            words = tokenizer.decode([token for token in reply.reply_ids if token not in stop_ids], skip_special_tokens=True).strip()
            reason = _rejection(words, reply.stopped, seen)
            if reason is None:
                seen.add(_normalised(words))
                kept[reply.key] = words
                on_prompt(1)
            log.write(json.dumps({"key": reply.key, "prompt": words if reason is None else None, "rejected": reason}) + "\n")
            log.flush()
    if len(kept) < count:
        return None
    return [kept[key] for key in sorted(kept)][:count]


def _rejection(words: str, stopped: bool, seen: set[str]) -> str | None:
    if not stopped:
        return "unfinished"
    length = len(words.split())
    if length < MIN_WORDS:
        return "too short"
    if length > MAX_WORDS:
        return "too long"
    if _normalised(words) in seen:
        return "duplicate"
    return None


def _normalised(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def _read_attempts(path: Path) -> dict[int, str | None]:
    attempts: dict[int, str | None] = {}
    if not path.exists():
        return attempts
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
            attempts[int(entry["key"])] = entry["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            # A line cut short by a hard stop: the attempt is simply made again.
            if number != len(lines):
                raise TandemError(f"{path}:{number} is not a prompt record; delete the file to write the prompts again.")
    return attempts
