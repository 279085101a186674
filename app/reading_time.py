"""How long the models take to read a message on this machine, from how fast they read the
last long one: the estimate shown before a long message is sent, and the time left while
one is read.

The engine reports a long prompt's reading as PromptProgress events (engine/session.py
`_read_prompt`). Timed on the engine thread, they give the pair's prompt speed in tokens/s; the
prompt's characters against its token count (PromptPrepared) give characters per token, so
that a message's reading time can be told from its length alone, without asking the
tokenizer on the busy engine thread."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from engine.events import PromptProgress

from .figures import duration
from .storage import ChatStore

# A message that takes longer than this to read is announced before it is sent.
LONG_READ_S = 10.0
# Fewer prompt tokens than this say little about characters per token: the chat template's
# own tokens would count for too much of them.
MIN_TOKENS_FOR_RATIO = 64
STATE_KEY = "prompt_speed:"  # + the pair's name: its last measured speed in the chats file


@dataclass(frozen=True)
class ReadingSpeed:
    """One pair's measured prompt reading on this machine."""

    tokens_per_s: float
    chars_per_token: float

    def seconds_for(self, characters: int) -> float:
        return characters / self.chars_per_token / self.tokens_per_s


class ReadingClock:
    """One prompt's reading, timed from its PromptProgress events and when the engine thread
    sent each (time.monotonic()). Before two events have come, the time left is told from the
    pair's speed measured earlier, if any."""

    def __init__(self, known_tokens_per_s: float | None = None):
        self._known_tokens_per_s = known_tokens_per_s
        self._first: tuple[float, int] | None = None  # (when, tokens done) at the first event
        self._latest: tuple[float, int] | None = None
        self.tokens_total = 0

    def add(self, event: PromptProgress, read_at: float) -> None:
        now = (read_at, event.tokens_done)
        if self._first is None:
            self._first = now
        self._latest = now
        self.tokens_total = event.tokens_total

    @property
    def finished(self) -> bool:
        return self._latest is not None and self._latest[1] >= self.tokens_total

    @property
    def tokens_per_s(self) -> float | None:
        """The speed measured over this reading so far; None before it has advanced."""
        if self._first is None or self._latest is None:
            return None
        seconds, tokens = self._latest[0] - self._first[0], self._latest[1] - self._first[1]
        return tokens / seconds if seconds > 0 and tokens > 0 else None

    def seconds_left(self) -> float | None:
        speed = self.tokens_per_s or self._known_tokens_per_s
        if self._latest is None or not speed:
            return None
        return (self.tokens_total - self._latest[1]) / speed


class ReadingSpeeds:
    """Each pair's last measured reading speed, kept in the chats file's state (one short row
    per pair), so that the first long message after a restart is announced too."""

    def __init__(self, store: ChatStore):
        self._store = store
        self._speeds: dict[str, ReadingSpeed] = {}

    def get(self, pair_name: str) -> ReadingSpeed | None:
        if pair_name not in self._speeds:
            saved = self._store.state(STATE_KEY + pair_name)
            try:
                self._speeds[pair_name] = ReadingSpeed(**json.loads(saved)) if saved else None
            except (TypeError, ValueError):  # a row from another version: measured again
                self._speeds[pair_name] = None
        return self._speeds[pair_name]

    def remember(self, pair_name: str, speed: ReadingSpeed) -> None:
        self._speeds[pair_name] = speed
        self._store.set_state(STATE_KEY + pair_name, json.dumps(asdict(speed)))


def chars_per_token(characters: int, prompt_tokens: int) -> float | None:
    """The prompt's characters per token, or None when the prompt is too short to say."""
    return characters / prompt_tokens if prompt_tokens >= MIN_TOKENS_FOR_RATIO else None


def long_read_warning(seconds: float) -> str:
    return (f"Reading this message will take about {duration(seconds)} on this machine before the reply starts. "
            "Send anyway? Press Send again, or edit it.")
