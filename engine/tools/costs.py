"""What one call costs on a device, and a reply re-timed with another device's costs.

`tandem bench --record-costs FILE` measures, on the machine it runs on: one target forward
over n new tokens after a chat-sized context (n = 1 … 64, the sizes verification uses), the
target's prompt reading per token, and one call of each drafter (draft model, EAGLE-3 head).
`tandem bench --cost-table FILE` then re-times every reply of a run with such a table: each
target call at the cost of its size, each draft call at its drafter's cost. The bench's
replies fix what was drafted and accepted; the table says what that would have cost there.
Python's own time per round is not in the table, so a prediction is a floor on that device.
"""
from __future__ import annotations

import bisect
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import methods
from ..chat_prompt import Message, build_prompt
from ..config import ConfigError
from ..round import time_verify
from ..runtime import ModelRuntime
from ..session import LoadedPair
from ..stats import GenerationStats

VERIFY_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PREFILL_TOKENS = 256
REPEATS = 7
PROBE = "Tell me about the history of the printing press and why it mattered."


@dataclass(frozen=True)
class CostTable:
    device: str
    source: str  # how the figures were obtained ("measured by tandem bench …", or a citation)
    verify_ms: dict[int, float]  # target forward over n new tokens
    prefill_ms_per_token: float  # a long prompt's reading, per token
    draft_call_ms: dict[str, float]  # by drafter: "draft" (a draft model), "eagle" (an EAGLE-3 head)

    def verify_cost_ms(self, tokens: int) -> float:
        """A forward over `tokens`: interpolated between measured sizes; past the largest,
        prompt reading's cost per token (a prompt is read in one forward too)."""
        sizes = sorted(self.verify_ms)
        if tokens in self.verify_ms:
            return self.verify_ms[tokens]
        if tokens > sizes[-1]:
            return max(self.verify_ms[sizes[-1]], tokens * self.prefill_ms_per_token)
        at = bisect.bisect_left(sizes, tokens)
        if at == 0:
            return self.verify_ms[sizes[0]]
        low, high = sizes[at - 1], sizes[at]
        share = (tokens - low) / (high - low)
        return self.verify_ms[low] + share * (self.verify_ms[high] - self.verify_ms[low])

    def reply_seconds(self, stats: GenerationStats, drafter: str | None) -> float:
        """What the reply's target and draft calls would cost on this table's device. The
        first call reads the prompt: priced as prompt reading, not as a verify of as many
        tokens (llama.cpp verifies 48 tokens for twice what it reads them for as a prompt)."""
        calls = stats.target_call_tokens
        prompt_ms = max(self.verify_ms[min(self.verify_ms)], calls[0] * self.prefill_ms_per_token) if calls else 0.0
        target_ms = prompt_ms + sum(self.verify_cost_ms(tokens) for tokens in calls[1:])
        draft_ms = stats.draft_calls * self.draft_call_ms.get(drafter, 0.0) if drafter else 0.0
        return (target_ms + draft_ms) / 1000

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "source": self.source,
            "target_verify_ms": {str(size): ms for size, ms in sorted(self.verify_ms.items())},
            "target_prefill_ms_per_token": self.prefill_ms_per_token, "draft_call_ms": self.draft_call_ms,
        }

    @classmethod
    def load(cls, path: Path) -> CostTable:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                device=str(data["device"]), source=str(data.get("source", "")),
                verify_ms={int(size): float(ms) for size, ms in data["target_verify_ms"].items()},
                prefill_ms_per_token=float(data["target_prefill_ms_per_token"]),
                draft_call_ms={str(name): float(ms) for name, ms in data.get("draft_call_ms", {}).items()},
            )
        except OSError as error:
            raise ConfigError(f"cannot read the cost table {path}: {error.strerror}") from error
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(f"{path} is not a cost table (tandem bench --record-costs writes one): {error!r}") from error


def drafter_of(method: str) -> str | None:
    """Which table entry prices a method's draft calls (None for a peer, which reports none).
    Only a model's forwards count as draft calls, so n-gram drafting is free whatever the
    entry; `chain` and `auto` draft with the pair's draft model where it has one."""
    row = methods.BY_NAME.get(method)
    if row is None:
        return None
    return "eagle" if methods.EAGLE_HEAD in row.needs else "draft"


def measure_costs(pair: LoadedPair, device: str) -> CostTable:
    """This machine's table, for `pair`'s target and drafters."""
    probe = build_prompt(pair.tokenizer, [Message("user", PROBE)], None, pair.context_length).token_ids
    target = pair.target_runner
    context = (probe * (200 // len(probe) + 1))[:200]
    verify = {}
    try:
        time_verify(target, context, VERIFY_SIZES[-1])  # warm-up: first calls allocate
        for size in VERIFY_SIZES:
            verify[size] = 1000 * statistics.median(time_verify(target, context, size) for _ in range(REPEATS))
        prefill = statistics.median(_prefill_seconds(target, (probe * (PREFILL_TOKENS // len(probe) + 1))[:PREFILL_TOKENS]) for _ in range(3))
        drafters = {}
        if pair.draft_runner is not None:
            drafters["draft"] = _call_ms(pair.draft_runner, context)
        if pair.eagle_runner is not None:
            target.logits_for(context)  # the head reads the target's features of the context
            drafters["eagle"] = _call_ms(pair.eagle_runner, context)
    finally:
        pair.reset_caches()
    return CostTable(
        device=device, source=f"measured by tandem bench --record-costs on {time.strftime('%Y-%m-%d')}",
        verify_ms=verify, prefill_ms_per_token=1000 * prefill / PREFILL_TOKENS, draft_call_ms=drafters,
    )


def _prefill_seconds(target: ModelRuntime, tokens: list[int]) -> float:
    target.reset()
    started = time.perf_counter()
    float(target.forward(tokens)[-1, 0])  # wait for the device
    return time.perf_counter() - started


def _call_ms(runtime: ModelRuntime, context: list[int]) -> float:
    """One drafting call: a token after the cached context (median of REPEATS)."""
    runtime.logits_for(context)
    seconds = []
    for token in context[:REPEATS]:
        started = time.perf_counter()
        float(runtime.forward([token])[-1, 0])
        seconds.append(time.perf_counter() - started)
        runtime.crop(len(context) - 1)
    return 1000 * statistics.median(seconds)
