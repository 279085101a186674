"""What a generation yields: the one streaming API that the terminal chat, the bench and
the desktop app all consume."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .stats import GenerationStats


class Provenance(str, Enum):
    """Who produced a token."""

    DRAFT = "draft"  # proposed by the drafter and accepted by the target's verification
    TARGET = "target"  # produced by the target after it rejected a draft token (or in `ar`)
    BONUS = "bonus"  # the target's extra token after it accepted every draft token
    UNCHECKED = "unchecked"  # SPRINTER: drafted and passed by the learned verifier; the target never saw it


@dataclass(frozen=True)
class PromptPrepared:
    """First event of every generation: how the conversation was turned into a prompt."""

    prompt_tokens: int
    dropped_turns: int  # oldest messages left out because the history exceeded the context
    context_length: int


@dataclass(frozen=True)
class PromptProgress:
    """How far the models have read a long prompt, before the first text: sent after each
    chunk of a prompt long enough for reading it to be a noticeable wait."""

    tokens_done: int
    tokens_total: int
    # Prompt tokens already cached before this reading (the conversation so far): each token
    # read attends to them too, so they slow the reading down.
    tokens_before: int = 0

    @property
    def fraction(self) -> float:
        return self.tokens_done / self.tokens_total if self.tokens_total else 1.0


@dataclass(frozen=True)
class TextDelta:
    """New text, and the tokens that produced it with their provenance.

    `pieces[i]` is the text that token i completed, so "".join(pieces) == text. A piece is
    empty when its token completes no printable character yet (part of a multi-byte
    character); that text arrives with the token that completes it.
    """

    text: str
    token_ids: tuple[int, ...]
    provenance: tuple[Provenance, ...]
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatsUpdate:
    stats: GenerationStats


@dataclass(frozen=True)
class Finished:
    """Last event: the whole reply and its final figures."""

    text: str
    token_ids: tuple[int, ...]
    provenance: tuple[Provenance, ...]
    stats: GenerationStats
    stop_reason: str  # "eos" | "length" (the token limit) | "context" (the context is full) | "stopped"
    dropped_turns: int = 0
    extra: dict = field(default_factory=dict)


Event = PromptPrepared | PromptProgress | TextDelta | StatsUpdate | Finished
