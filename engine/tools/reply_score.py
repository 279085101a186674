"""A finished reply, judged after the fact: how likely its target finds it, and whether the
caches it left behind still hold what a fresh forward computes. `tandem soak` runs it after
every reply to catch garbage (issue 45: once, `auto` at T = 0.7 wrote "||||KKKK…").

The likelihood is the target's own negative log-likelihood per token of the reply after its
prompt, at temperature 1 (engine/tools/quality.py's `target_nll`, one teacher-forced forward).
Sampled at T = 0.7 from a sound target a reply scores a nat or two a token; text the target
would not write scores several times that.

The loop check counts the longest stretch of the reply that repeats itself with a period of
up to LONGEST_PERIOD tokens ("||||", "KKKK", "I'm sorry. I'm sorry."). The likelihood misses
that kind of garbage: once a reply loops, every repeat is likely to the target.

The cache check asks each decoding cache (the target's, and the draft model's where the pair
has one) for the logits of one more token after the tokens it holds, then crops it back, and
compares them with a fresh cache's forward over the same tokens. A cache whose keys and values
were overwritten, or whose bookkeeping points at the wrong slots, disagrees by whole nats; one
that is sound, by the runtime's rounding. The EAGLE-3 head's cache is not checked.

Both run on a second cache over the same weights, opened on first use and kept, so the caches
the next reply reuses are left as they were.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..chat_prompt import Message, build_prompt
from ..config import DecodeSettings
from ..events import Finished
from ..runtime import ModelRuntime
from .quality import target_nll


LONGEST_PERIOD = 8  # tokens: a loop of a word or a short phrase


def longest_loop(token_ids: list[int]) -> int:
    """The most tokens in a row that each equal the token `period` before it, over every period
    up to LONGEST_PERIOD: 0 for a reply that never repeats itself, 18 for a two-token phrase
    written ten times."""
    longest = 0
    for period in range(1, LONGEST_PERIOD + 1):
        run = 0
        for position in range(period, len(token_ids)):
            run = run + 1 if token_ids[position] == token_ids[position - period] else 0
            longest = max(longest, run)
    return longest


@dataclass(frozen=True)
class ReplyScore:
    tokens: int  # the reply's tokens, as it ended (a stopped reply's partial ones)
    nll_per_token: float | None  # None for a reply without tokens
    # Per decoding cache ("target", "draft"): the largest gap, in log-probability, between its
    # next-token distribution and a fresh forward's over the same tokens (absent: it was empty).
    cache_gaps: dict[str, float] = field(default_factory=dict)
    # What the target's cache holds that is not the conversation, if anything
    cache_problem: str | None = None
    longest_loop: int = 0  # `longest_loop` of the reply's tokens

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens, "nll_per_token": self.nll_per_token,
            "cache_gaps": self.cache_gaps, "cache_problem": self.cache_problem, "longest_loop": self.longest_loop,
        }


class ReplyChecker:
    """Scores `pair`'s (an engine.session.LoadedPair) finished replies. Call it on the thread
    that runs the pair's replies, between them."""

    def __init__(self, pair: Any):
        self.pair = pair
        self._fresh: dict[str, ModelRuntime] = {}  # a second cache per model, opened on first use

    def score(
        self, messages: list[Message], system_prompt: str | None, settings: DecodeSettings, finished: Finished,
    ) -> ReplyScore:
        pair = self.pair
        reply = list(finished.token_ids)
        # The prompt the generation built: a soak's conversations never reach the context's
        # end, so the room it kept for its drafts does not drop a turn here either.
        room = min(settings.max_new_tokens + 1, pair.context_length // 2)
        prompt = build_prompt(pair.tokenizer, messages, system_prompt, pair.context_length - room).token_ids
        summed, tokens = target_nll(self._fresh_runtime("target"), prompt, reply)
        conversation = list(prompt) + reply
        gaps = {"target": cache_gap(pair.target_runner, self._fresh_runtime("target"))}
        if pair.draft_runner is not None:
            gaps["draft"] = cache_gap(pair.draft_runner, self._fresh_runtime("draft"))
        return ReplyScore(
            tokens, summed / tokens if tokens else None,
            {name: gap for name, gap in gaps.items() if gap is not None},
            foreign_tokens(pair.target_runner.cached_ids, conversation),
            longest_loop(reply),
        )

    def close(self) -> None:
        for runtime in self._fresh.values():
            runtime.close()
        self._fresh.clear()

    def _fresh_runtime(self, model: str) -> ModelRuntime:
        if model not in self._fresh:
            self._fresh[model] = (self.pair.target if model == "target" else self.pair.draft).open_runtime()
        return self._fresh[model]


def cache_gap(decoding: ModelRuntime, fresh: ModelRuntime) -> float | None:
    """The largest |log p| gap between `decoding`'s next-token distribution after one more
    token on its cached state and `fresh`'s after a forward over the tokens it attends to; None when
    `decoding` holds nothing. `decoding` is cropped back to what it held."""
    cached = list(decoding.cached_ids)
    if not cached:
        return None
    attended = cached[decoding.first_attended_slot():]  # a windowed draft's fresh read is of its window
    if decoding.chain_length != len(decoding):
        raise ValueError("a cache between replies holds a chain, not a token tree")
    probe = cached[-1]  # any token the model has read works: the test is of the state before it
    try:
        from_cache = decoding.forward([probe])[-1]
    finally:
        decoding.crop(len(cached))
    fresh.reset()
    try:
        from_scratch = fresh.forward(attended + [probe])[-1]
    finally:
        fresh.reset()
    return distribution_gap(from_cache, from_scratch)


def distribution_gap(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest |log p| gap between two next-token distributions. A model with a reduced
    vocabulary (the demo draft) gives its dropped tokens -inf: those must be -inf in both, and
    are left out of the gap (-inf minus -inf is NaN, which had made every draft check pass
    unseen); a token -inf in one and not the other is an infinite gap."""
    ours, theirs = torch.log_softmax(logits.float(), -1), torch.log_softmax(reference.float(), -1)
    possible = torch.isfinite(ours)
    if not torch.equal(possible, torch.isfinite(theirs)):
        return float("inf")
    return float((ours[possible] - theirs[possible]).abs().max()) if bool(possible.any()) else float("inf")


def foreign_tokens(cached: list[int], conversation: list[int]) -> str | None:
    """Where the target's cache departs from the conversation it decoded, if it does. Past the
    conversation's end it may hold more: a round's tokens beyond the token limit or a stop token."""
    for position, (held, written) in enumerate(zip(cached, conversation)):
        if held != written:
            return f"the target's cache holds token {held} at position {position}, where the conversation has {written}"
    return None
