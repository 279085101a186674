"""A loaded model pair and the replies it generates.

    pair = load_pair(demo_pair())
    generation = pair.generate([Message("user", "Hi!")], DecodeSettings())
    # or pair.complete("Once upon a time", DecodeSettings()): plain text, no chat template
    for event in generation:      # PromptPrepared, [PromptProgress ...], TextDelta / StatsUpdate ..., Finished
        ...
    generation.stop()             # from any thread; takes effect after the current round
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from . import heap, methods, tokenizer_shelf
from .chat_prompt import Message, build_prompt, build_text_prompt, reply_to_continue
from .compat import check_pair_compatible
from .config import ConfigError, DecodeSettings, PairConfig
from .detokenize import IncrementalDetokenizer, text_after
from .drafters.auto import SpeedRecord, record_path
from .drafters.backoff_ngram import TABLE_FILE, BackoffNgram, NgramCounts
from .drafters.base import RoundOutcome
from .drafters.chain_length import ChainLength
from .drafters.tree_drafter import TreePolicy, TreeShape
from .errors import ModelLoadError, OutOfMemoryError
from .events import Event, Finished, PromptPrepared, PromptProgress, Provenance, StatsUpdate, TextDelta
from .heads.features import EXTRA_FEATURES
from .heads.store import DraftHeads, find_heads
from .models import LoadedModel, load_eagle_head, load_model
from .runtime_choice import RuntimeChoice, applies_to, forget_choice, load_choice, placement, unmeasured_prefers_torch
from .paths import cache_dir
from .runtime import ModelRuntime
from .runtime.device import OUT_OF_MEMORY_ERRORS, memory_in_use_mb, release_cached_memory
from .runtime.cpu import cpu_name, physical_cores
from .runtime.eagle3 import Eagle3Runtime
from .runtime.eagle3_head import Eagle3Head
from .runtime.windowed import DRAFT_WINDOW_TOKENS, WindowedRuntime
from .round import play_round, time_verify
from .sampling import Sampler
from .stats import GenerationStats
from .tree_shape import AutoTreeShape, FixedTreeShape
from .verifying.synthetic import synthetic_verifier

ProgressCallback = Callable[[str, "float | None"], None]

# A prompt is read in one forward, unless the models lack enough of it for that to be a
# noticeable wait (6,300 tokens took the demo target 33 s on a 2-core CPU): then it is read
# in chunks, with a PromptProgress after each.
PROMPT_PROGRESS_MIN_TOKENS = 512
PROMPT_CHUNK_TOKENS = 256
# The last tokens of a reply being continued that its new text is decoded after (spaces).
CONTEXT_TOKENS = 4

VERIFIER_CHOICES = (
    ("block", "Exact — block verification", True),
    ("token", "Exact — token-level", True),
)


class LoadedPair:
    """A target, its drafter, and their caches. Generations run one at a time."""

    def __init__(
        self, config: PairConfig, target: LoadedModel, draft: LoadedModel | None, eagle: Eagle3Head | None = None,
        draft_window: int = DRAFT_WINDOW_TOKENS,
    ):
        self.config = config
        self.target = target
        self.draft = draft
        # An EAGLE-3 head drafts from features the target records while it verifies.
        self.target_runner = target.open_runtime(feature_layers=eagle.config.layer_ids if eagle is not None else ())
        self.eagle_runner = Eagle3Runtime(eagle, self.target_runner, target.embeddings()) if eagle is not None else None
        self.tokenizer = target.tokenizer
        self.vocab_size = self.target_runner.vocab_size
        self.ngram_model = BackoffNgram(self.vocab_size, _background_table(draft))
        self.heads: DraftHeads | None = None
        self.runtime_choice: RuntimeChoice | None = None  # set when `tandem tune` chose the runtime
        self.heads_problem: str | None = None  # why calibrated heads could not be used
        if draft is not None:
            try:
                self.heads = find_heads(config.name, target.label, draft.label, draft.folder)
            except ModelLoadError as error:
                self.heads_problem = str(error)
        self.draft_runner: ModelRuntime | None = None
        self.draft_window = draft_window  # the tokens the draft reads of a long prompt (runtime/windowed.py)
        self._open_draft()
        # Automatic tree shapes keep what they learnt (costs, acceptance per depth) across replies.
        self.auto_tree_shapes = {
            row.name: AutoTreeShape() for row in methods.TABLE if row.knob == methods.KNOB_TREE_SHAPE and row.name in self.methods
        }
        # Chains' lengths keep what they learnt (costs, acceptance per depth) across replies, one
        # per drafter: `chain` and `auto`'s chain share the draft model's, `eagle` the head's.
        self.chain_lengths: dict[str, ChainLength] = {}
        # What `auto` has learnt of each method's speed on this machine, kept across starts.
        self.speed_record = SpeedRecord.load(record_path(cache_dir(), _pair_key(config, target), _machine_key(target)))
        self.context_length = min(target.context_length, draft.context_length if draft else target.context_length)
        self.stop_token_ids = target.stop_token_ids

    def _open_draft(self) -> None:
        """Open the draft's cache (with hidden states when heads read them). One draft cache
        serves every method: each round starts by syncing it."""
        if self.draft_runner is not None:
            self.draft_runner.close()
        if self.draft is None:
            return
        self.draft_runner = draft_runner = self._windowed(self.draft.open_runtime(hidden_states=self.heads is not None))
        if self.heads is not None and not self._heads_fit(draft_runner):
            self.heads, self.heads_problem = None, "The calibrated heads were trained on a draft of another width; run tandem calibrate again."
            draft_runner.close()
            self.draft_runner = self._windowed(self.draft.open_runtime())

    def _windowed(self, draft_runner: ModelRuntime) -> ModelRuntime:
        return WindowedRuntime(draft_runner, self.draft_window)

    def _heads_fit(self, draft_runner: ModelRuntime) -> bool:
        """Whether the heads read hidden states as wide as this draft's (one token's forward)."""
        draft_runner.forward([0])
        width = draft_runner.last_hidden_states().shape[-1]
        draft_runner.reset()
        return self.heads.feature_width == width + EXTRA_FEATURES

    def attach_heads(self, heads: DraftHeads) -> None:
        """Use newly calibrated heads: the draft's cache is reopened to return hidden states."""
        self.heads, self.heads_problem = heads, None
        self._open_draft()

    # What the methods table asks of a pair (engine/methods.py)

    @property
    def has_draft_model(self) -> bool:
        return self.draft_runner is not None

    @property
    def supports_trees(self) -> bool:
        return self.target_runner.supports_trees and (self.draft_runner is None or self.draft_runner.supports_trees)

    @property
    def has_eagle_head(self) -> bool:
        return self.eagle_runner is not None

    @property
    def has_heads(self) -> bool:
        return self.heads is not None and self.draft_runner is not None

    @property
    def methods(self) -> tuple[str, ...]:
        return methods.offered_by(self)

    @property
    def verifiers(self) -> tuple[tuple[str, str, bool], ...]:
        """(name, label, is_exact) of every verification mode this pair offers."""
        return VERIFIER_CHOICES

    def describe(self) -> dict:
        return {
            "name": self.config.name,
            "target": self.target.label,
            "draft": self.draft.label if self.draft else self.config.draft_model_label,  # the head has its own key below
            "eagle": Path(self.config.eagle).name if self.eagle_runner is not None and self.config.eagle else None,
            "device": str(self.target.device),
            "runtime": self.runtime_label,
            "forward_plan": self.target.forward_plan_line,  # None on llama.cpp
            "precision": self.target.precision,
            "context_length": self.context_length,
            "memory_mb": memory_in_use_mb(self.target.device),
            "runtime_choice": self.runtime_choice.describe() if self.runtime_choice is not None else None,
        }

    @property
    def runtime_label(self) -> str:
        """Which runtime runs the pair, e.g. "llama.cpp" or "llama.cpp + torch (draft)", and
        what background work means for it now ("torch (static cache), compiled")."""
        target = _with_note(self.target.runtime, self.target_runner.background_note)
        if self.draft is None:
            return target
        draft = _with_note(self.draft.runtime, self.draft_runner.background_note if self.draft_runner is not None else None)
        return target if draft == target else f"{target} + {draft} (draft)"

    def start_background_work(self) -> None:
        """Start what makes the runtimes faster later (a compile); replies run meanwhile."""
        for runner in self._runners():
            runner.start_background_work()

    def when_background_work_changes(self, listener: Callable[[], None]) -> None:
        """Call `listener()`, on another thread, whenever a runtime's background work ends."""
        for runner in self._runners():
            runner.when_background_work_changes(listener)

    @property
    def has_background_work(self) -> bool:
        """Whether a runtime does (or did) work in the background: compiling its forward."""
        return any(runner.background_note is not None for runner in self._runners())

    def wait_for_background_work(self) -> None:
        """Start the background work and block until it has ended (the bench times the
        compiled runtime, not the compile)."""
        self.start_background_work()
        for runner in self._runners():
            ended = threading.Event()
            runner.when_background_work_changes(ended.set)
            if runner.background_note is not None:
                ended.wait()
        if self.has_background_work:
            self.after_background_work()

    def after_background_work(self) -> None:
        """Measure again what the background work changed: the tree verify costs measured at
        load were the uncompiled forward's. Call it on the thread that runs replies."""
        self.calibrate_trees(again=True)

    def calibrate_trees(self, again: bool = False) -> None:
        """Measure once (or `again`) what verifying n tree tokens costs this target on this
        device, for every automatic tree shape, so that no reply waits for it before its first token."""
        if not self.auto_tree_shapes or (not again and all(shape.calibrated for shape in self.auto_tree_shapes.values())):
            return
        # Measured after the conversation the cache holds, when it holds one (measuring
        # again mid-chat): it stays cached, all but its last token, instead of being read
        # again by the next reply.
        conversation = list(self.target_runner.cached_ids)
        keep_conversation = len(conversation) > 1
        probe = conversation if keep_conversation else build_prompt(
            self.tokenizer, [Message("user", "Hello!")], None, self.context_length
        ).token_ids
        first, *others = self.auto_tree_shapes.values()
        try:
            first.calibrate(lambda tokens: time_verify(self.target_runner, probe, tokens))
        finally:
            if not keep_conversation:
                self.target_runner.reset()
        for shape in others:
            shape.calibrate_like(first)
        for length in self.chain_lengths.values():
            length.seed(first.verify_seconds)

    def tree_policy(self, settings: DecodeSettings, method: str) -> TreePolicy:
        """The tree shape `method` drafts with: the settings' fixed one, or its automatic one
        (which keeps what it learns across replies)."""
        fixed = settings.fixed_tree_shape
        if fixed is None:
            return self.auto_tree_shapes[method]
        budget, depth = fixed
        return FixedTreeShape(TreeShape(budget=budget, depth=depth))

    def chain_length(self, drafter_name: str, most: int) -> ChainLength:
        """How long the chains of `drafter_name` ("chain": the draft model, "eagle": the head)
        are, at most `most` tokens: one per drafter, kept across replies, its verify costs
        starting from the curve measured for the tree shapes where there is one."""
        length = self.chain_lengths.get(drafter_name)
        if length is None or length.most != max(1, most):
            length = self.chain_lengths[drafter_name] = ChainLength(most)
            calibrated = [shape for shape in self.auto_tree_shapes.values() if shape.calibrated]
            if calibrated:
                length.seed(calibrated[0].verify_seconds)
        return length

    def generate(
        self, messages: list[Message], settings: DecodeSettings, system_prompt: str | None = None
    ) -> Generation:
        return Generation(self, messages, settings, system_prompt)

    def complete(self, text: str, settings: DecodeSettings) -> Generation:
        """A continuation of `text` as it is, without the chat template (the OpenAI
        completions endpoint, a base model's prompt)."""
        return Generation(self, [], settings, None, text_prompt=text)

    def reset_caches(self) -> None:
        """Forget cached prefixes, so the next generation starts with a full prefill."""
        for runner in self._runners():
            runner.reset()
        self.ngram_model.reset()

    def _runners(self) -> list[ModelRuntime]:
        return [runner for runner in (self.target_runner, self.draft_runner, self.eagle_runner) if runner is not None]

    def close(self) -> None:
        """Drop the models so their memory can be reclaimed."""
        self.reset_caches()
        for runner in self._runners():
            runner.close()
        for model in (self.target, self.draft):
            if model is not None:
                model.close()
        self.target = self.draft = None  # type: ignore[assignment]
        release_cached_memory()


class Generation:
    """One reply, as an iterator of events. Not reusable: iterate it once; a second iteration
    raises instead of starting an empty run, and `result_so_far()` gives the reply of one
    that was cut short (Ctrl-C)."""

    def __init__(
        self, pair: LoadedPair, messages: list[Message], settings: DecodeSettings, system_prompt: str | None,
        text_prompt: str | None = None,
    ):
        self.pair = pair
        self.messages = list(messages)
        self.settings = settings
        self.system_prompt = system_prompt
        self.text_prompt = text_prompt  # continued as it is, instead of `messages`
        self._stop_requested = threading.Event()
        self._started = False
        self._streamed: _Streamed | None = None

    def stop(self) -> None:
        """Ask the loop to finish after its current round. Safe from any thread."""
        self._stop_requested.set()

    def result_so_far(self) -> Finished | None:
        """The reply as far as it was streamed, as a stopped Finished event; None before the
        prompt was prepared. For a generation whose iteration ended early (KeyboardInterrupt
        inside a round, or a consumer that stopped reading): what the user saw is kept."""
        streamed = self._streamed
        if streamed is None:
            return None
        stats = streamed.stats.snapshot()
        stats.elapsed_s = time.perf_counter() - streamed.started
        return Finished(
            text=text_after(self.pair.tokenizer, streamed.context_ids, streamed.reply),
            token_ids=tuple(streamed.reply),
            provenance=tuple(streamed.provenance),
            stats=stats,
            stop_reason="stopped",
            dropped_turns=streamed.dropped_turns,
        )

    def __iter__(self) -> Iterator[Event]:
        if self._started:
            # Iterating again would run a new, already stopped reply and report it as empty.
            raise RuntimeError("This generation already ran; use result_so_far() for its reply, or generate again.")
        self._started = True
        try:
            yield from self._run()
        except OUT_OF_MEMORY_ERRORS as error:
            heap.trim()  # what the failed round allocated goes back before the user tries again
            where = "The machine" if isinstance(error, MemoryError) else "The GPU"
            raise OutOfMemoryError(
                f"{where} ran out of memory while generating. Try a shorter conversation, "
                "8-bit precision, or a smaller model pair."
            ) from error

    def _run(self) -> Iterator[Event]:
        pair, settings = self.pair, self.settings
        refusal = method_refusal(pair, settings.method)
        if refusal:
            raise ConfigError(refusal)
        if settings.fixed_tree_shape is None:
            pair.calibrate_trees()  # a no-op once measured, as it is after load_pair
        row = methods.method(settings.method)
        drafter, verify = row.drafter(pair, settings), row.verifier(settings)
        if settings.synthetic_acceptance:  # a benchmark of the machinery, not of the pair's agreement
            verify = synthetic_verifier(settings.synthetic_acceptance, pair.stop_token_ids, settings.seed)
        # Room past the prompt for one round's draft and the target's own token.
        reserve = min(settings.max_new_tokens + drafter.lookahead + 1, pair.context_length // 2)
        max_prompt_tokens = pair.context_length - reserve
        if self.text_prompt is None:
            prompt = build_prompt(pair.tokenizer, self.messages, self.system_prompt, max_prompt_tokens)
        else:
            prompt = build_text_prompt(pair.tokenizer, self.text_prompt, max_prompt_tokens)
        yield PromptPrepared(len(prompt.token_ids), prompt.dropped_messages, pair.context_length)

        sampler = Sampler(settings.temperature, settings.top_k, settings.top_p, _generator(settings.seed))
        stats = GenerationStats(method=settings.method, prompt_tokens=len(prompt.token_ids), exact=settings.exact)
        # A reply (or text) being continued: its last tokens are the context its new text follows.
        carried_on = reply_to_continue(self.messages) if self.text_prompt is None else self.text_prompt
        context_ids = list(pair.tokenizer.encode(carried_on, add_special_tokens=False))[-CONTEXT_TOKENS:] if carried_on else []
        detokenizer = IncrementalDetokenizer(pair.tokenizer, context_ids)
        context = list(prompt.token_ids)
        reply: list[int] = []
        provenance: list[Provenance] = []
        started = last_stats = time.perf_counter()
        stop_reason = "length"
        self._streamed = _Streamed(reply, provenance, stats, started, prompt.dropped_messages, context_ids)  # shares the lists
        yield from self._read_prompt(context, [pair.target_runner, *drafter.prompt_runtimes])

        while len(reply) < settings.max_new_tokens:
            if self._stop_requested.is_set():
                stop_reason = "stopped"
                break
            room = pair.context_length - len(context) - 1
            if room < 1:
                stop_reason = "context"  # full: Continue could not add to it
                break
            outcome = play_round(pair.target_runner, drafter, verify, context, room - 1, sampler)
            tokens, kinds, hit_stop = self._trim(outcome, settings.max_new_tokens - len(reply))
            _count_round(stats, outcome)
            stats.unchecked_tokens += kinds.count(Provenance.UNCHECKED)  # of those the budget kept
            context += tokens
            reply += tokens
            provenance += kinds
            now = time.perf_counter()
            stats.tokens_generated = len(reply)
            stats.elapsed_s = now - started
            if stats.time_to_first_token_s is None:
                stats.time_to_first_token_s = now - started
            pieces = tuple(detokenizer.add([token]) for token in tokens)
            yield TextDelta("".join(pieces), tuple(tokens), tuple(kinds), pieces)
            if hit_stop:
                stats.stop_tokens = 1
                stop_reason = "eos"
                break
            if now - last_stats >= settings.stats_every_s:
                last_stats = now
                yield StatsUpdate(stats.snapshot())

        stats.elapsed_s = time.perf_counter() - started
        stats.note = drafter.explain()
        yield StatsUpdate(stats.snapshot())
        heap.trim()  # the rounds' freed logits go back to the system, not the idle process
        yield Finished(
            text=text_after(pair.tokenizer, context_ids, reply),
            token_ids=tuple(reply),
            provenance=tuple(provenance),
            stats=stats.snapshot(),
            stop_reason=stop_reason,
            dropped_turns=prompt.dropped_messages,
        )

    def _read_prompt(self, context: list[int], runtimes: list[ModelRuntime]) -> Iterator[PromptProgress]:
        """Cache the prompt but its last token (the first round's) in every model, a chunk at a
        time, when the target lacks enough of it to keep the user waiting; say how far it got.
        The chunks form the same causal chain as one forward would, so the reply is the same."""
        end = len(context) - 1
        starts = [end + 1 - len(runtime.pending(context)) for runtime in runtimes]  # first uncached position
        if end - starts[0] < PROMPT_PROGRESS_MIN_TOKENS:
            return  # the first round reads it, as fast as one forward can
        first = min(starts)
        yield PromptProgress(0, end - first, first)
        for chunk_start in range(first, end, PROMPT_CHUNK_TOKENS):
            if self._stop_requested.is_set():
                return
            chunk_end = min(chunk_start + PROMPT_CHUNK_TOKENS, end)
            for runtime, start in zip(runtimes, starts):
                if start < chunk_end:
                    runtime.forward(context[max(start, chunk_start):chunk_end])
            yield PromptProgress(chunk_end - first, end - first, first)

    def _trim(self, outcome: RoundOutcome, budget: int) -> tuple[list[int], list[Provenance], bool]:
        """Cut a round's tokens at the first stop token (which is not shown) and at the budget."""
        tokens, kinds = outcome.tokens[:budget], outcome.provenance[:budget]
        for index, token in enumerate(tokens):
            if token in self.pair.stop_token_ids:
                return tokens[:index], kinds[:index], True
        return tokens, kinds, False


def method_refusal(pair: LoadedPair, method: str) -> str | None:
    """Why `pair` cannot decode with `method`, or None when it can: asked when a method is
    chosen, so that a reply never finds out."""
    return methods.refusal(pair, method, pair.config.name, pair.heads_problem)


@dataclass
class _Streamed:
    """What a generation has streamed so far: tokens are added before the delta that shows them."""

    reply: list[int]
    provenance: list[Provenance]
    stats: GenerationStats
    started: float
    dropped_turns: int
    context_ids: list[int]  # a continued reply's last tokens, which its text is decoded after


def _count_round(stats: GenerationStats, outcome: RoundOutcome) -> None:
    if outcome.target_called:
        stats.target_calls += 1
        stats.target_call_tokens.append(outcome.target_tokens)
    else:
        stats.target_calls_skipped += 1
    stats.draft_calls += outcome.draft_calls
    stats.draft_time_s += outcome.draft_s
    stats.target_time_s += outcome.target_s
    stats.tree_nodes_verified += outcome.tree_nodes
    if outcome.proposal.drafted_by:
        stats.rounds_by_method[outcome.proposal.drafted_by] = stats.rounds_by_method.get(outcome.proposal.drafted_by, 0) + 1
    stats.stage_tokens_proposed += outcome.proposal.stage_proposed
    stats.stage_tokens_accepted += outcome.proposal.stage_accepted
    if outcome.proposed:
        stats.record_round(outcome.proposed, outcome.accepted)


def _with_note(runtime: str, note: str | None) -> str:
    return runtime if note is None else f"{runtime}, {note}"


def _pair_key(config: PairConfig, target: LoadedModel) -> str:
    # Not the compile setting: `target.runtime` already tells a compiled runtime from an eager
    # one, and the setting does nothing to llama.cpp or CUDA pairs, whose records it would orphan.
    described = {key: value for key, value in config.to_dict().items() if key != "compile"}
    return json.dumps(described, sort_keys=True) + f"|{target.runtime}|{target.precision}"


def _machine_key(target: LoadedModel) -> str:
    """What a method's speed depends on besides the pair: the processor, the threads, the device."""
    return f"{cpu_name()}|{os.cpu_count()}|{physical_cores()}|{torch.get_num_threads()}|{target.device}"


def _background_table(draft: LoadedModel | None) -> NgramCounts | None:
    """The n-gram table shipped in the draft's folder, if there is one."""
    folder = getattr(draft, "folder", None) if draft is not None else None
    if folder is None or not (Path(folder) / TABLE_FILE).is_file():
        return None
    return NgramCounts.load(Path(folder) / TABLE_FILE)


def _generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def load_pair(config: PairConfig, progress: ProgressCallback | None = None, choice: RuntimeChoice | None = None) -> LoadedPair:
    """Load the target and the draft of `config`, and check that they can work together.
    `choice` places the target on a runtime and precision (`tandem tune` trying one); without
    it, the choice `tandem tune` saved for this pair here, where the pair leaves both to auto."""
    report = progress or (lambda message, fraction: None)
    # What the user left to "auto" runs where `tandem tune` measured it fastest on this machine.
    saved = load_choice(config) if choice is None and applies_to(config) else None
    with heap.loading():  # what outlives the load; warming up and measuring run as replies do
        try:
            pair = _open_pair(config, progress, report, choice or saved)
        except (ModelLoadError, OutOfMemoryError) as error:
            if saved is None and choice is None and unmeasured_prefers_torch(config):
                # The demo target placed on torch without a measurement (its conversion or
                # load failed: a full disk, a broken transformers): its own setting may still load.
                report(f"The demo model did not load on torch ({error}); loading it as its runtime setting places it.", None)
                pair = _open_pair(config, progress, report, None, measured_defaults=False)
            elif saved is None:
                raise
            else:
                # A choice that no longer loads (its GGUF export deleted, a GPU with less memory
                # free) must not lock the user out of the pair: load it as auto, and measure again.
                forget_choice(config)
                report(f"The runtime tandem tune chose ({saved.label}) no longer loads the pair ({error}); loading it as auto.", None)
                saved = None
                pair = _open_pair(config, progress, report, None)
    pair.runtime_choice = saved
    # The pair before this one may share a model with it; what it does not, goes now.
    tokenizer_shelf.keep_only(model.tokenizer for model in (pair.target, pair.draft) if model is not None)
    for runner in (pair.target_runner, pair.draft_runner):
        if runner is not None and runner.warm_up_message:
            report(runner.warm_up_message, None)
            runner.warm_up()
    if pair.auto_tree_shapes:
        report("Measuring what verifying a token tree costs on this device…", None)
        pair.calibrate_trees()
    heap.trim()  # the measurement's freed logits (up to a 128-node tree's) go back now
    # After the measurement, which would otherwise time forwards slowed by the compile.
    pair.start_background_work()
    report("Ready", 1.0)
    return pair


def _open_pair(
    config: PairConfig, progress: ProgressCallback | None, report: ProgressCallback, choice: RuntimeChoice | None,
    measured_defaults: bool = True,
) -> LoadedPair:
    # The pair keeps the user's own settings whatever `choice` places where: they are what gets saved.
    placed = placement(config, choice, measured_defaults)
    report(f"Loading target {config.target.source}…", None)
    target = load_model(placed.target, progress, runtime=placed.target_runtime, compile=config.compile)
    draft = None
    try:
        if config.draft is not None:
            report(f"Loading draft {config.draft.source}…", None)
            draft = load_model(config.draft, progress, as_draft=True, runtime=placed.draft_runtime, compile=config.compile)
            check_pair_compatible(target.tokenizer, draft.tokenizer)
        eagle = None
        if config.eagle is not None:
            report(f"Loading EAGLE-3 head {config.eagle}…", None)
            eagle = load_eagle_head(config.eagle, target)
        return LoadedPair(config, target, draft, eagle)
    except BaseException:
        for model in (draft, target):  # a half-loaded pair must not stay in memory
            if model is not None:
                model.close()
        raise
