"""How long the models take to read a message on this machine, from how they read the last
long one: the estimate shown before a long message is sent, and the time left while one is
read.

The engine reports a long prompt's reading as PromptProgress events (engine/session.py
`_read_prompt`), a chunk at a time. A token's reading costs a fixed part (its products with
the weights) and a part that grows with the tokens before it (its attention over them): the
demo target read 2,000 tokens at ~900 tokens/s and 7,000 at ~500 (docs/BENCHMARKS.md), so a
speed in tokens/s measured on one length mistold another by up to 2x. The chunks' times,
timed on the engine thread, give both parts by least squares. The prompt's characters against
its token count (PromptPrepared) give characters per token, so that a message's reading time
can be told from its length alone, without asking the tokenizer on the busy engine thread."""
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
# Chunks a reading needs before its cost's two parts are told apart; fewer: one rate.
MIN_CHUNKS_FOR_SLOPE = 3
STATE_KEY = "reading_cost:"  # + the pair's name: its last measured reading cost in the chats file


def seconds_to_read(tokens: float, before: float, per_token: float, per_token_seen: float) -> float:
    """Reading `tokens` after `before` cached ones, at a cost of `per_token` a token plus
    `per_token_seen` for each token it attends to (those before it and itself, on average
    before + tokens / 2)."""
    return tokens * (per_token + per_token_seen * (before + tokens / 2))


@dataclass(frozen=True)
class ReadingCost:
    """How one pair reads prompts on this machine: reading n tokens after `before` cached ones
    takes n * (seconds_per_token + seconds_per_token_seen * (before + n / 2))."""

    seconds_per_token: float
    seconds_per_token_seen: float  # for each token read, per token it attends to
    chars_per_token: float

    def seconds_to_read(self, tokens: float, before: float = 0.0) -> float:
        return seconds_to_read(tokens, before, self.seconds_per_token, self.seconds_per_token_seen)

    def seconds_for(self, characters: int, characters_before: int = 0) -> float:
        return self.seconds_to_read(characters / self.chars_per_token, characters_before / self.chars_per_token)


def fitted_cost(chunks: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(seconds a token, seconds a token per token it attends to) from chunks read, each
    (tokens, seconds, mean tokens attended to): the least-squares fit of seconds = tokens *
    (a + b * attended) with b >= 0, or None when the chunks do not determine it."""
    chunks = [chunk for chunk in chunks if chunk[0] > 0 and chunk[1] > 0]
    if not chunks:
        return None
    rate = sum(seconds for _, seconds, _ in chunks) / sum(tokens for tokens, _, _ in chunks)
    if len(chunks) < MIN_CHUNKS_FOR_SLOPE:
        return rate, 0.0
    # normal equations over the columns x1 = tokens and x2 = tokens * attended
    s11 = sum(t * t for t, _, _ in chunks)
    s12 = sum(t * t * p for t, _, p in chunks)
    s22 = sum((t * p) ** 2 for t, _, p in chunks)
    y1 = sum(t * s for t, s, _ in chunks)
    y2 = sum(t * p * s for t, s, p in chunks)
    determinant = s11 * s22 - s12 * s12
    if determinant <= 1e-12 * s11 * s22:  # every chunk at one position: no slope to see
        return rate, 0.0
    a, b = (y1 * s22 - y2 * s12) / determinant, (s11 * y2 - s12 * y1) / determinant
    if b < 0 or a <= 0:  # noise, or a reading that got faster: one rate says it better
        return rate, 0.0
    return a, b


class ReadingClock:
    """One prompt's reading, timed from its PromptProgress events and when the engine thread
    sent each (time.monotonic()). Until its chunks tell the cost apart, the time left is told
    from the pair's cost measured earlier, if any."""

    def __init__(self, known: ReadingCost | None = None):
        self._known = known
        self._events: list[tuple[float, int]] = []  # (when, tokens done)
        self.tokens_total = 0
        self.tokens_before = 0

    def add(self, event: PromptProgress, read_at: float) -> None:
        self._events.append((read_at, event.tokens_done))
        self.tokens_total, self.tokens_before = event.tokens_total, event.tokens_before

    @property
    def finished(self) -> bool:
        return bool(self._events) and self._events[-1][1] >= self.tokens_total

    def cost(self) -> tuple[float, float] | None:
        """(seconds a token, per token attended to) measured over this reading so far; None
        before it has advanced."""
        chunks = [
            (done - done_before, when - when_before, self.tokens_before + (done_before + done) / 2)
            for (when_before, done_before), (when, done) in zip(self._events, self._events[1:])
        ]
        return fitted_cost(chunks)

    def seconds_left(self) -> float | None:
        if not self._events:
            return None
        # Until this reading has chunks enough to see its slope, the cost measured before
        # knows it better than this reading's first rate.
        enough = len(self._events) - 1 >= MIN_CHUNKS_FOR_SLOPE
        known = (self._known.seconds_per_token, self._known.seconds_per_token_seen) if self._known else None
        cost = self.cost() if enough or known is None else known
        if cost is None:
            return None
        done = self._events[-1][1]
        return seconds_to_read(self.tokens_total - done, self.tokens_before + done, *cost)


class ReadingCosts:
    """Each pair's last measured reading cost, kept in the chats file's state (one short row
    per pair), so that the first long message after a restart is announced too."""

    def __init__(self, store: ChatStore):
        self._store = store
        self._costs: dict[str, ReadingCost | None] = {}

    def get(self, pair_name: str) -> ReadingCost | None:
        if pair_name not in self._costs:
            saved = self._store.state(STATE_KEY + pair_name)
            try:
                self._costs[pair_name] = ReadingCost(**json.loads(saved)) if saved else None
            except (TypeError, ValueError):  # a row from another version: measured again
                self._costs[pair_name] = None
        return self._costs[pair_name]

    def remember(self, pair_name: str, cost: ReadingCost) -> None:
        self._costs[pair_name] = cost
        self._store.set_state(STATE_KEY + pair_name, json.dumps(asdict(cost)))


def chars_per_token(characters: int, prompt_tokens: int) -> float | None:
    """The prompt's characters per token, or None when the prompt is too short to say."""
    return characters / prompt_tokens if prompt_tokens >= MIN_TOKENS_FOR_RATIO else None


def long_read_warning(seconds: float) -> str:
    return (f"Reading this message will take about {duration(seconds)} on this machine before the reply starts. "
            "Send anyway? Press Send again, or edit it.")
