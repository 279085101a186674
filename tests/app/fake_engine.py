"""A stand-in for the engine with the same API as `engine.session` and `app.engine_api`, for
GUI tests where a real model is not the point: replies are deterministic, stream word by
word with a configurable delay, mix draft and target provenance, and come with stats.
Loads can be made to fail per model source, and a reply to raise after N tokens."""
from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, field

from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.errors import IncompatiblePairError, ModelLoadError, OutOfMemoryError
from engine.events import Finished, PromptPrepared, PromptProgress, Provenance, StatsUpdate, TextDelta
from engine.stats import GenerationStats

DEFAULT_REPLY = (
    "Here is a **short** answer with a list:\n\n"
    "- first point\n- second point\n\n"
    "| method | speed |\n|---|---|\n| ar | 1x |\n| chain | 2x |\n\n"
    "```python\nprint('hello from the fake engine')\n```\n\n"
    "That is all."
)
# Draft tokens accepted in successive rounds of `chain`; a round of K accepted ends in a bonus.
ACCEPTED_PER_ROUND = (3, 1, 4, 0, 2, 4)
VERIFIERS = (("block", "Exact — block verification", True), ("token", "Exact — token-level", True))


def words(text: str) -> list[str]:
    """The fake tokenizer: each word with the whitespace before it is one token."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass
class FakeEngine:
    reply: str = DEFAULT_REPLY
    token_delay_s: float = 0.0
    load_delay_s: float = 0.0
    failing_sources: dict[str, Exception] = field(default_factory=dict)
    fail_after_tokens: int | None = None
    reading_chunks: int = 0  # as for a long prompt: PromptProgress events before the first text
    generation_error: Exception = field(
        default_factory=lambda: OutOfMemoryError("The machine ran out of memory while generating.")
    )
    tokenizer_families: dict[str, str] = field(default_factory=dict)  # source -> family; default "smol"
    online: bool = False
    loads: list[PairConfig] = field(default_factory=list)
    requests: list[tuple[list, DecodeSettings, str | None]] = field(default_factory=list)
    closed_pairs: list[str] = field(default_factory=list)

    def load_pair(self, config: PairConfig, progress) -> FakePair:
        self.loads.append(config)
        progress(f"Loading target {config.target.source}…", None)
        for step in range(1, 5):
            time.sleep(self.load_delay_s / 4)
            progress(f"Loading target {config.target.source}…", step / 4)
        for spec in (config.target, config.draft):
            if spec is not None and spec.source in self.failing_sources:
                raise self.failing_sources[spec.source]
        if config.draft is not None:
            reason = self.draft_incompatibility(config.target, config.draft)
            if reason:
                raise IncompatiblePairError(reason)
        return FakePair(self, config)

    def draft_incompatibility(self, target: ModelSpec, draft: ModelSpec) -> str | None:
        target_family = self.tokenizer_families.get(target.source, "smol")
        draft_family = self.tokenizer_families.get(draft.source, "smol")
        if target_family != draft_family:
            return f"different tokenizer ({draft_family} vocabulary, the target uses {target_family})"
        return None

    def download_model(self, repo_id: str, progress) -> str:
        if not self.online:
            raise ModelLoadError(f"Could not download {repo_id}: Hugging Face cannot be reached (offline).")
        for step in range(1, 5):
            progress(f"Downloading {repo_id}", step / 4)
        return repo_id


class FakePair:
    def __init__(self, engine: FakeEngine, config: PairConfig):
        self.engine = engine
        self.config = config

    @property
    def methods(self) -> tuple[str, ...]:
        return ("ar", "chain")

    @property
    def verifiers(self) -> tuple[tuple[str, str, bool], ...]:
        return VERIFIERS

    def describe(self) -> dict:
        return {
            "name": self.config.name,
            "target": self.config.target.source,
            "draft": self.config.draft_label,
            "device": "cpu",
            "precision": "bf16",
            "context_length": 2048,
            "memory_mb": 812.0,
        }

    def generate(self, messages, settings: DecodeSettings, system_prompt: str | None = None) -> FakeGeneration:
        self.engine.requests.append((list(messages), settings, system_prompt))
        return FakeGeneration(self.engine, messages, settings)

    def close(self) -> None:
        self.engine.closed_pairs.append(self.config.name)


class FakeGeneration:
    def __init__(self, engine: FakeEngine, messages, settings: DecodeSettings):
        self.engine = engine
        self.messages = list(messages)
        self.settings = settings
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def __iter__(self):
        settings, engine = self.settings, self.engine
        prompt_tokens = sum(len(words(message.content)) for message in self.messages)
        yield PromptPrepared(prompt_tokens, 0, 2048)
        for chunk in range(engine.reading_chunks + 1 if engine.reading_chunks else 0):
            time.sleep(engine.token_delay_s)
            yield PromptProgress(chunk * 256, engine.reading_chunks * 256)
        tokens = words(engine.reply)
        stop_reason = "eos" if len(tokens) <= settings.max_new_tokens else "length"
        tokens = tokens[: settings.max_new_tokens]
        stats = GenerationStats(method=settings.method, prompt_tokens=prompt_tokens)
        accepted_per_round = itertools.cycle(ACCEPTED_PER_ROUND)
        started = time.perf_counter()
        emitted = 0
        provenance: list[Provenance] = []
        while emitted < len(tokens):
            if self._stop.is_set():
                stop_reason = "stopped"
                break
            if engine.fail_after_tokens is not None and emitted >= engine.fail_after_tokens:
                raise engine.generation_error
            time.sleep(engine.token_delay_s)
            # 1. one round: some accepted draft tokens, then the target's own token
            if settings.method == "ar":
                drafted = 0
                kinds = [Provenance.TARGET]
            else:
                drafted = min(next(accepted_per_round), settings.draft_tokens)
                own = Provenance.BONUS if drafted == settings.draft_tokens else Provenance.TARGET
                kinds = [Provenance.DRAFT] * drafted + [own]
                stats.record_round(settings.draft_tokens, drafted)
            kinds = kinds[: len(tokens) - emitted]
            round_tokens = tokens[emitted : emitted + len(kinds)]
            emitted += len(round_tokens)
            provenance += kinds
            # 2. counters, as the real engine keeps them
            now = time.perf_counter()
            stats.target_calls += 1
            stats.tokens_generated = emitted
            stats.elapsed_s = now - started
            stats.draft_time_s = 0.2 * stats.elapsed_s if settings.method != "ar" else 0.0
            stats.target_time_s = stats.elapsed_s - stats.draft_time_s
            if stats.time_to_first_token_s is None:
                stats.time_to_first_token_s = stats.elapsed_s
            ids = tuple(range(emitted - len(round_tokens), emitted))
            yield TextDelta("".join(round_tokens), ids, tuple(kinds))
            yield StatsUpdate(stats.snapshot())
        text = "".join(tokens[:emitted])
        yield Finished(
            text=text,
            token_ids=tuple(range(emitted)),
            provenance=tuple(provenance),
            stats=stats.snapshot(),
            stop_reason=stop_reason,
        )
