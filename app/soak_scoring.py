"""`tandem soak --score-replies`: every reply judged by its target (engine/tools/reply_score.py), on
the engine thread, right after it ends; then the garbage check over all of them.

The engine is wrapped, not changed: its pairs' replies run as in the window, and each one's
Finished event reaches the soak carrying the score in `extra`. The score is computed before
that event leaves the engine thread, so the next reply, queued behind it, starts after it.

The reference is plain decoding (`ar`) at the same temperature: the worst NLL per token of
its replies, and the longest stretch one of them spent repeating itself, are what sampling
from the sound target gives. A reply of any other method above either fails the check (a
looping reply scores a low NLL: each repeat is likely once the loop has begun). Replies shorter than `min_tokens` are scored but not judged, on either
side: the mean of two tokens' surprise is the luck of two draws, and the stopped replies
(stopped at their first text) are mostly that short.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.chat_prompt import Message
from engine.config import DecodeSettings, PairConfig
from engine.events import Finished

from .engine_api import EngineApi, Progress

SCORE_KEY = "reply_score"  # where a Finished event's `extra` carries the score
REFERENCE_METHOD = "ar"
MIN_JUDGED_TOKENS = 8
# How far, in log-probability, a decoding cache's next-token distribution may stray from a
# fresh forward's. Rounding between a cached and a one-pass forward moves logits by ~1e-5 in
# float32 and by ~1e-2 in bfloat16; a corrupted cache moves them by whole nats.
CACHE_GAP_LIMIT = 0.1


class ScoringEngine:
    """An EngineApi whose pairs score every reply before its Finished event goes out."""

    def __init__(self, engine: EngineApi):
        self._engine = engine

    def load_pair(self, config: PairConfig, progress: Progress) -> Any:
        return ScoringPair(self._engine.load_pair(config, progress))

    def __getattr__(self, name: str) -> Any:  # the rest of the EngineApi, as it is
        return getattr(self._engine, name)


class ScoringPair:
    """A loaded pair whose generations carry their reply's score."""

    def __init__(self, pair: Any):
        from engine.tools.reply_score import ReplyChecker  # on the engine thread, where torch is loaded

        self._pair = pair
        self._checker = ReplyChecker(pair)

    def generate(self, messages: list[Message], settings: DecodeSettings, system_prompt: str | None = None) -> Any:
        return ScoredGeneration(self._pair.generate(messages, settings, system_prompt), self._checker, messages, settings, system_prompt)

    def close(self) -> None:
        self._checker.close()
        self._pair.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pair, name)


class ScoredGeneration:
    def __init__(self, generation: Any, checker: Any, messages: list[Message], settings: DecodeSettings, system_prompt: str | None):
        self._generation, self._checker = generation, checker
        self._messages, self._settings, self._system_prompt = list(messages), settings, system_prompt

    def stop(self) -> None:
        self._generation.stop()

    def __iter__(self) -> Iterator[Any]:
        for event in self._generation:
            if isinstance(event, Finished):
                score = self._checker.score(self._messages, self._system_prompt, self._settings, event)
                event = dataclasses.replace(event, extra=event.extra | {SCORE_KEY: score.to_dict()})
            yield event


@dataclass(frozen=True)
class ScoredReply:
    """What the garbage check needs of a reply (app/soak.py's ReplyRecord has it)."""

    index: int
    method: str
    prompt: str
    text: str
    score: dict | None  # ReplyScore.to_dict(), None for a reply that failed


@dataclass(frozen=True)
class GarbageVerdict:
    reference_worst: float | None  # plain decoding's worst NLL per token (judged replies)
    reference_judged: int
    others_worst: float | None
    others_judged: int
    above: list[ScoredReply]  # replies of other methods above the reference's worst
    unscored: list[int]  # indices of replies that ended without a score
    cache_gap_worst: float | None
    cache_failures: list[str]  # a line per reply whose caches disagreed with a fresh forward
    reference_loop: int | None = None  # plain decoding's longest loop, in tokens (judged replies)
    looping: list[ScoredReply] = field(default_factory=list)  # replies of other methods that looped longer

    @property
    def passed(self) -> bool:
        return (self.reference_worst is not None and not self.above and not self.looping and not self.unscored
                and not self.cache_failures)


def judge(replies: list[ScoredReply], min_tokens: int = MIN_JUDGED_TOKENS, gap_limit: float = CACHE_GAP_LIMIT) -> GarbageVerdict:
    """Plain decoding's worst NLL per token and longest loop, and every other reply above either."""
    scored = [reply for reply in replies if reply.score is not None]
    judged = [reply for reply in scored if reply.score["tokens"] >= min_tokens]
    reference = [reply.score["nll_per_token"] for reply in judged if reply.method == REFERENCE_METHOD]
    others = [reply for reply in judged if reply.method != REFERENCE_METHOD]
    worst = max(reference, default=None)
    above = [] if worst is None else sorted(
        (reply for reply in others if reply.score["nll_per_token"] > worst), key=lambda reply: -reply.score["nll_per_token"]
    )
    gaps = [(reply, name, gap) for reply in scored for name, gap in reply.score["cache_gaps"].items()]
    cache_failures = [
        f"reply {reply.index + 1} ({reply.method}): the {name} cache is {gap:.3g} nats from a fresh forward"
        for reply, name, gap in gaps if not gap <= gap_limit  # NaN too: a gap that could not be measured
    ] + [f"reply {reply.index + 1} ({reply.method}): {reply.score['cache_problem']}" for reply in scored if reply.score["cache_problem"]]
    # Reports written before the loop check have no loop figure: 0, never above.
    reference_loop = max((reply.score.get("longest_loop", 0) for reply in judged if reply.method == REFERENCE_METHOD), default=None)
    looping = [] if reference_loop is None else sorted(
        (reply for reply in others if reply.score.get("longest_loop", 0) > reference_loop), key=lambda reply: -reply.score["longest_loop"]
    )
    return GarbageVerdict(
        worst, len(reference), max((reply.score["nll_per_token"] for reply in others), default=None), len(others), above,
        [reply.index for reply in replies if reply.score is None], max((gap for *_, gap in gaps), default=None), cache_failures,
        reference_loop, looping,
    )


def distribution(values: list[float]) -> dict | None:
    """Quantiles of the NLLs per token, for the report."""
    if not values:
        return None
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return {
        "count": len(ordered), "min": ordered[0], "median": statistics.median(ordered), "p90": at(0.9), "p99": at(0.99),
        "max": ordered[-1], "mean": statistics.fmean(ordered),
    }


def verdict_lines(verdict: GarbageVerdict, min_tokens: int = MIN_JUDGED_TOKENS) -> tuple[bool, str, list[str]]:
    """(passed, the check's line, the replies above the limit), for the soak's table."""
    if verdict.reference_worst is None:
        detail = f"no plain-decoding ({REFERENCE_METHOD}) reply of {min_tokens}+ tokens to compare with"
    else:
        others = "none" if verdict.others_worst is None else f"{verdict.others_worst:.2f}"
        detail = (
            f"target NLL/token: {REFERENCE_METHOD}'s worst {verdict.reference_worst:.2f} over {verdict.reference_judged} "
            f"replies; the others' worst {others} over {verdict.others_judged}; {len(verdict.above)} above"
            f"; longest loop: {REFERENCE_METHOD}'s {verdict.reference_loop} tokens, {len(verdict.looping)} longer"
        )
    gap = "no cache checked" if verdict.cache_gap_worst is None else f"caches within {verdict.cache_gap_worst:.2g} nats of a fresh forward"
    detail += f"; {gap} (limit {CACHE_GAP_LIMIT:g})"
    if verdict.cache_failures:
        detail += f"; {len(verdict.cache_failures)} cache failures, first: {verdict.cache_failures[0]}"
    if verdict.unscored:
        detail += f"; {len(verdict.unscored)} replies unscored"
    above = [
        f"  GARBAGE? reply {reply.index + 1} ({reply.method}) NLL/token {reply.score['nll_per_token']:.2f} over "
        f"{reply.score['tokens']} tokens, to {reply.prompt[:40]!r}: {reply.text[:60]!r}"
        for reply in verdict.above
    ] + [
        f"  GARBAGE? reply {reply.index + 1} ({reply.method}) repeats itself for {reply.score['longest_loop']} of its "
        f"{reply.score['tokens']} tokens, to {reply.prompt[:40]!r}: {reply.text[:60]!r}"
        for reply in verdict.looping
    ]
    return verdict.passed, detail, above
