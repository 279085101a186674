"""A stand-in for the engine with the same API as `engine.session` and `app.engine_api`, for
GUI tests where a real model is not the point: replies are deterministic, stream word by
word with a configurable delay, mix draft and target provenance, and come with stats.
Loads can be made to fail per model source, and a reply to raise after N tokens.

A pair with a draft model offers `adaptive` and `sprinter` once it has heads: from the start
(`FakeEngine(heads=True)`) or after `calibrate`, which reports its phases like the real one,
stops when asked, and can be made to fail. SPRINTER replies carry UNCHECKED tokens."""
from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine import methods
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.errors import IncompatiblePairError, ModelLoadError, OutOfMemoryError, TandemError
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
# SPRINTER: tokens let out unchecked in successive rounds; a round of `sprinter_max_unchecked`
# (capped at 6 here) never calls the target. The flagged token is accepted every other round.
UNCHECKED_PER_ROUND = (3, 6, 1, 0, 6, 2)
CALIBRATION_PROMPTS = 8


def heads_card(pair_name: str = "demo") -> dict:
    """A card like `tandem calibrate` writes (engine/heads/calibrate.py), with plausible figures."""

    def mode(eta: float, passed: float, accuracy: float, constant: float, bce: float) -> dict:
        sprinter = {"threshold": 0.8, "false_positive_rate": eta, "pass_rate": passed, "unchecked_error_rate": eta / 3,
                    "accuracy": accuracy, "constant_accuracy": constant, "heldout_examples": 2048}
        acceptance = {"bce": bce, "constant_bce": bce + 0.17, "heldout_examples": 2048}
        return {"sprinter": sprinter, "acceptance": acceptance, "training_examples": 18000}

    return {
        "feature_width": 580, "pair": pair_name,
        "data": {"prompts": 160, "heldout_prompts": 16, "reply_tokens": 19873, "temperature": 0.7},
        "modes": {"greedy": mode(0.098, 0.61, 0.87, 0.74, 0.36), "sampled": mode(0.1, 0.47, 0.81, 0.66, 0.44)},
        "seconds": 412.0,
    }


@dataclass
class FakeHeads:
    card: dict


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
    reading_chunk_tokens: int = 256  # the prompt tokens each of them reads
    reading_chunk_s: float | None = None  # how long each takes (None: token_delay_s)
    stats_every_round: bool = True  # False: figures every settings.stats_every_s, as the real engine sends them
    generation_error: Exception = field(
        default_factory=lambda: OutOfMemoryError("The machine ran out of memory while generating.")
    )
    tokenizer_families: dict[str, str] = field(default_factory=dict)  # source -> family; default "smol"
    online: bool = False
    heads: bool = False  # pairs with a draft model load with calibrated heads
    heads_problem: str | None = None  # ... or with heads on disk that cannot be used
    calibration_step_s: float = 0.0
    calibration_error: Exception | None = None  # raised half-way through a calibration
    calibrations: int = 0  # calibrations that finished
    compile_s: float | None = None  # pairs compile in the background for this long (None: no compile)
    runtime_choice: str | None = None  # what `tandem tune` chose, as LoadedPair.describe() says it
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

    def calibrate(self, pair: FakePair, progress, should_stop) -> dict | None:
        if pair.config.draft is None:
            raise TandemError(f"The pair {pair.config.name!r} has no draft model: there is nothing to calibrate.")
        steps = [("replies", done, CALIBRATION_PROMPTS) for done in range(CALIBRATION_PROMPTS + 1)]
        steps += [("training", done, 2) for done in range(3)]
        for index, (phase, done, total) in enumerate(steps):
            if should_stop():
                return None
            if self.calibration_error is not None and index == len(steps) // 2:
                raise self.calibration_error
            progress(phase, done, total)
            time.sleep(self.calibration_step_s)
        pair.heads, pair.heads_problem = FakeHeads(heads_card(pair.config.name)), None
        self.calibrations += 1
        return pair.heads.card


class FakePair:
    def __init__(self, engine: FakeEngine, config: PairConfig):
        self.engine = engine
        self.config = config
        with_heads = engine.heads and config.draft is not None
        self.heads = FakeHeads(heads_card(config.name)) if with_heads else None
        self.heads_problem = engine.heads_problem if config.draft is not None else None
        self.compile_note = "compiling in the background" if engine.compile_s is not None else None
        self.remeasured = 0  # after_background_work calls
        self._listeners: list = []
        if engine.compile_s is not None:
            # As the real compile: it ends on a thread of its own.
            timer = threading.Timer(engine.compile_s, self._compiled)
            timer.daemon = True
            timer.start()

    def _compiled(self) -> None:
        self.compile_note = "compiled"
        for listener in self._listeners:
            listener()

    def when_background_work_changes(self, listener) -> None:
        self._listeners.append(listener)

    def after_background_work(self) -> None:
        self.remeasured += 1

    @property
    def methods(self) -> tuple[str, ...]:
        # Like every real pair, it offers `auto` (replies then draft like the chain here).
        return ("auto", "ar", "chain") + (tuple(row.name for row in methods.TABLE if methods.HEADS in row.needs) if self.heads is not None else ())

    @property
    def verifiers(self) -> tuple[tuple[str, str, bool], ...]:
        return VERIFIERS

    def describe(self) -> dict:
        compiling = {"runtime": f"torch (static cache), {self.compile_note}"} if self.compile_note else {}
        return compiling | {
            "name": self.config.name,
            "target": self.config.target.source,
            "draft": self.config.draft_model_label,
            "eagle": Path(self.config.eagle).name if self.config.eagle else None,
            "device": "cpu",
            "precision": "bf16",
            "context_length": 2048,
            "memory_mb": 812.0,
            "runtime_choice": self.engine.runtime_choice,
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
        chunk_s = engine.token_delay_s if engine.reading_chunk_s is None else engine.reading_chunk_s
        for chunk in range(engine.reading_chunks + 1 if engine.reading_chunks else 0):
            if self._stop.is_set():  # as the engine's reading: stopped between chunks
                break
            time.sleep(chunk_s)
            yield PromptProgress(chunk * engine.reading_chunk_tokens, engine.reading_chunks * engine.reading_chunk_tokens)
        tokens = words(engine.reply)
        if self.messages and self.messages[-1].role == "assistant":  # Continue: carry on after the reply so far
            tokens = tokens[len(words(self.messages[-1].content)):]
        stop_reason = "eos" if len(tokens) <= settings.max_new_tokens else "length"
        tokens = tokens[: settings.max_new_tokens]
        stats = GenerationStats(method=settings.method, prompt_tokens=prompt_tokens, exact=settings.exact)
        accepted_per_round = itertools.cycle(ACCEPTED_PER_ROUND)
        unchecked_per_round = itertools.cycle(UNCHECKED_PER_ROUND)
        longest_unchecked = min(settings.sprinter_max_unchecked, 6)
        rounds = 0
        started = last_stats = time.perf_counter()
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
            rounds += 1
            target_called = True
            if settings.method == "ar":
                drafted = 0
                kinds = [Provenance.TARGET]
            elif settings.method == "sprinter":  # unchecked tokens, then a flagged one the target checks
                unchecked = min(next(unchecked_per_round), longest_unchecked)
                kinds = [Provenance.UNCHECKED] * unchecked
                if unchecked == longest_unchecked:
                    target_called = False
                else:
                    accepted = rounds % 2
                    kinds += [Provenance.DRAFT, Provenance.BONUS] if accepted else [Provenance.TARGET]
                    stats.record_round(1, accepted)
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
            if target_called:
                stats.target_calls += 1
            else:
                stats.target_calls_skipped += 1
            stats.unchecked_tokens += kinds.count(Provenance.UNCHECKED)
            stats.tokens_generated = emitted
            stats.elapsed_s = now - started
            stats.draft_time_s = 0.2 * stats.elapsed_s if settings.method != "ar" else 0.0
            stats.target_time_s = stats.elapsed_s - stats.draft_time_s
            if stats.time_to_first_token_s is None:
                stats.time_to_first_token_s = stats.elapsed_s
            ids = tuple(range(emitted - len(round_tokens), emitted))
            yield TextDelta("".join(round_tokens), ids, tuple(kinds), tuple(round_tokens))
            if engine.stats_every_round or now - last_stats >= settings.stats_every_s:
                last_stats = now
                yield StatsUpdate(stats.snapshot())
        text = "".join(tokens[:emitted])
        yield Finished(
            text=text,
            token_ids=tuple(range(emitted)),
            provenance=tuple(provenance),
            stats=stats.snapshot(),
            stop_reason=stop_reason,
        )
