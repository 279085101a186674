"""One distillation run in an output folder, from the target's first reply to the finished draft.

Layout of the output folder:

    DIR/config.json, model.safetensors, tokenizer files   the draft (written at the end)
    DIR/model.q8_0.gguf                                   the draft for the llama.cpp runtime
    DIR/report.json                                       how well it matches the target
    DIR/distill-work/run.json                             the run's settings, fixed at its start
    DIR/distill-work/heldout-*.pt, train-*.pt             the target's replies (data shards)
    DIR/distill-work/checkpoint.pt                        model, optimizer, step

Every phase picks up what an earlier invocation left, so `--resume` needs nothing but DIR.
"""
from __future__ import annotations

import copy
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from ...prompts import DISTILL_PROMPTS, read_prompts
from ...compat import check_pair_compatible
from ...config import ConfigError, ModelSpec, PairConfig
from ...errors import ModelLoadError
from ..export_gguf import DRAFT_PRECISION, export_gguf
from ...models import LoadedModel, load_model, load_tokenizer_only, resolve_source
from ...models import runtime_gguf
from ...runtime_choice import load_choice, placement
from ...runtime import llamacpp_library, llamacpp_process
from .data import GenerationSettings, generate_split, load_split, split_prompts
from .prompts import synthesize_prompts
from .writer import BatchReplyWriter, native_batch, native_refusal, torch_batch
from .vocabulary import choose_vocabulary, coverage, in_model_ids
from ...runtime.eagle3_head import save_head
from ...runtime.llamacpp_batch import LlamaCppSequenceBatch
from ...runtime.reduced_vocabulary import ReducedVocabulary
from .model import (
    DEFAULT_PREFIX_LAYERS, INITS, PREFIX, PRESETS, SIZES, DraftShape, build_draft, build_prefix_draft, forward_ms,
    prefix_shape, shape_summary,
)
from .train import StepReport, Trainer, TrainSettings, evaluate
from .eagle3 import Eagle3Settings, Eagle3Trainer, build_head, load_features, record_features

WORK_FOLDER = "distill-work"
RUN_FILE = "run.json"
DATA_DONE_FILE = "data-done.json"  # written once every shard is there, with the generation's figures
GENERATION_LOG = "generation-log.jsonl"  # what each invocation generated, and how fast
MAX_PROMPT_TOKENS = 256  # prompts longer than this (chat template included) are left out
REPORT_FILE = "report.json"
DEFAULT_PROMPTS = DISTILL_PROMPTS
DEFAULT_TOKENS = {"tiny": 20_000, "small": 1_000_000, PREFIX: 1_000_000}
# What a run trains: a draft model, or an EAGLE-3 head on the target's features.
KINDS = ("draft", "eagle3")
EAGLE3_VOCABULARY_FILE = "eagle3-vocabulary.json"
# The target's files that make up its tokenizer; the draft gets exact copies.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
)
# Data generation runs the target in bf16 on either device: int8 (the CUDA default for chat)
# is slower per batch, and the draft should learn the target as it usually runs.
TARGET_PRECISION = "bf16"


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides what a run produces; saved at its start, reused on resume."""

    target: str
    size: str = "small"
    tokens: int = DEFAULT_TOKENS["small"]
    heldout_tokens: int = 10_000
    init: str = "pca"  # a preset's embeddings; a prefix draft always starts from the target's weights
    layers: int = DEFAULT_PREFIX_LAYERS  # how many of the target's layers a prefix draft keeps
    prompts: str = str(DEFAULT_PROMPTS)
    synthetic_prompts: int = 0  # prompts the target writes itself, beside the prompts file's
    vocabulary: int = 0  # tokens a reduced draft keeps (0: the target's whole vocabulary)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    training: TrainSettings = field(default_factory=TrainSettings)
    kind: str = "draft"
    eagle3: Eagle3Settings = field(default_factory=Eagle3Settings)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.eagle3.ttt_steps < 1:
            raise ConfigError("the training-time test needs at least one step")
        if self.size not in SIZES:
            raise ConfigError(f"unknown draft size {self.size!r}; choose one of {', '.join(SIZES)}")
        if self.init not in INITS:
            raise ConfigError(f"unknown init {self.init!r}; choose one of {', '.join(INITS)}")
        if self.tokens < 1 or self.heldout_tokens < 1:
            raise ConfigError("the number of tokens must be at least 1")
        if self.vocabulary < 0:
            raise ConfigError("the vocabulary size cannot be negative")
        if self.synthetic_prompts < 0:
            raise ConfigError("the number of synthetic prompts cannot be negative")
        if self.generation.batch_size < 1:
            raise ConfigError("the batch size must be at least 1")
        if self.generation.max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be at least 1")
        if self.training.epochs <= 0:
            raise ConfigError("epochs must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSettings:
        try:
            return cls(
                **{key: value for key, value in data.items() if key not in ("generation", "training", "eagle3")},
                generation=GenerationSettings(**data["generation"]),
                training=TrainSettings(**data["training"]),
                eagle3=Eagle3Settings(**data.get("eagle3", {})),
            )
        except (KeyError, TypeError) as error:
            raise ConfigError(f"malformed distillation settings: {error}") from error


def _chat_placed(target: str) -> LoadedModel:
    """`target` loaded as a pair of it alone loads it on this machine."""
    config = PairConfig("distill", ModelSpec(target))
    where = placement(config, load_choice(config))
    return load_model(where.target, runtime=where.target_runtime)


def default_heldout_tokens(tokens: int) -> int:
    # Enough positions for a steady score, few enough to generate in a minute on a CPU.
    return min(max(tokens // 20, 512), 10_000)


@dataclass
class Progress:
    phase: str  # "held-out data", "training data" or "training"
    done: int
    total: int
    loss: float | None = None


@dataclass
class Outcome:
    status: str  # "finished", "stopped" (asked to stop) or "paused" (reached max_steps)
    step: int = 0
    total_steps: int = 0
    report: dict[str, Any] | None = None


class Distillation:
    """A run bound to its output folder. Create with `start` or `resume`, then `run`."""

    def __init__(self, out_dir: Path, settings: RunSettings, device: str):
        self.out_dir = out_dir
        self.work_dir = out_dir / WORK_FOLDER
        self.settings = settings
        self.device = device

    @classmethod
    def start(cls, out_dir: Path, settings: RunSettings, device: str = "auto") -> Distillation:
        work_dir = out_dir / WORK_FOLDER
        if (work_dir / RUN_FILE).exists():
            raise ConfigError(f"{out_dir} already holds a distillation run: add --resume to continue it, or choose another folder.")
        if (out_dir / "config.json").exists():
            raise ConfigError(f"{out_dir} already holds a model: choose another folder.")
        # Fail on a wrong target, prompts file or prefix depth before the folder is claimed for this run.
        source = resolve_source(ModelSpec(settings.target))
        read_prompts(Path(settings.prompts))
        if settings.size == PREFIX:
            prefix_shape(AutoConfig.from_pretrained(source), settings.layers)
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / RUN_FILE).write_text(json.dumps(settings.to_dict(), indent=2), encoding="utf-8")
        return cls(out_dir, settings, device)

    @classmethod
    def resume(cls, out_dir: Path, device: str = "auto") -> Distillation:
        run_file = out_dir / WORK_FOLDER / RUN_FILE
        try:
            data = json.loads(run_file.read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise ConfigError(f"nothing to resume: {out_dir} holds no distillation run") from error
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read {run_file}: {error}") from error
        return cls(out_dir, RunSettings.from_dict(data), device)

    def run(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        progress: Callable[[Progress], None] = lambda update: None,
        message: Callable[[str], None] = lambda text: None,
        max_steps: int | None = None,
    ) -> Outcome:
        """Generate what data is missing, train until done (or stopped), then write the draft."""
        settings = self.settings
        message(f"Loading the target {settings.target}…")
        # Batched sampling and training read the torch model itself.
        target = load_model(ModelSpec(settings.target, TARGET_PRECISION, self.device), runtime="torch")
        shape = self._shape(target)

        # 1. the target writes the data: its own prompts, then replies (held-out ones first,
        # so the untrained draft can be scored)
        if not self._data_complete():
            writer = self._reply_writer(target, message)
            try:
                prompts = self._prompts(writer, target, should_stop, progress)
                if prompts is None:
                    return Outcome("stopped")
                train_prompts, heldout_prompts = split_prompts(prompts)
                for phase, name, split, budget in (
                    ("held-out data", "heldout", heldout_prompts, settings.heldout_tokens),
                    ("training data", "train", train_prompts, settings.tokens),
                ):
                    generated = _Counter(phase, budget, progress)
                    outcome = generate_split(
                        writer, target.tokenizer, split, self.work_dir, name, budget, settings.generation,
                        target.stop_token_ids, should_stop, generated.add,
                    )
                    self._log_generation(name, generated, outcome.sampled_mass)
                    if not outcome.complete:
                        return Outcome("stopped")
            finally:
                writer.close()
            (self.work_dir / DATA_DONE_FILE).write_text(json.dumps(self._generation_summary(), indent=2), encoding="utf-8")
        generation_report = self._generation_summary()

        # 2. the draft (or the head) learns from it
        train_data = load_split(self.work_dir, "train")
        heldout_data = load_split(self.work_dir, "heldout")
        if settings.kind == "eagle3":
            return self._train_eagle3(target, train_data, heldout_data, generation_report, should_stop, progress, message, max_steps)
        vocabulary, vocabulary_report = None, {}
        if settings.vocabulary:
            # chosen from the training replies alone, so held-out coverage is an honest figure
            vocabulary = choose_vocabulary(train_data, settings.vocabulary, target.tokenizer, target.model.config.vocab_size)
            vocabulary_report = {"vocabulary": vocabulary.size, "heldout_coverage": coverage(heldout_data, vocabulary)}
            train_data, heldout_data = in_model_ids(train_data, vocabulary), in_model_ids(heldout_data, vocabulary)
        unproposable = vocabulary.other_id if vocabulary is not None else None
        if settings.size == PREFIX:
            draft = build_prefix_draft(target.model, settings.layers, vocabulary)
        else:
            draft = build_draft(target.model, shape, settings.init, settings.training.seed, vocabulary)
        trainer = Trainer(draft, train_data, heldout_data, settings.training, self.work_dir, target.device, unproposable)
        if trainer.resume():
            message(f"Resuming training at step {trainer.step} of {trainer.total_steps}.")

        def report_step(step: StepReport) -> None:
            progress(Progress("training", step.step, step.total_steps, step.loss))

        progress(Progress("training", trainer.step, trainer.total_steps))
        outcome = trainer.run(should_stop, report_step, max_steps)
        if not outcome.finished:
            return Outcome("stopped" if should_stop() else "paused", outcome.step, outcome.total_steps)

        # 3. the finished draft, loadable like any Hugging Face model folder
        message("Scoring the draft and writing it…")
        final = evaluate(trainer.draft, heldout_data, target.device, unproposable_id=unproposable)
        self._save_draft(trainer.draft, target, vocabulary)
        report = {
            "target": settings.target,
            "size": settings.size,
            "shape": shape_summary(shape, draft.config.vocab_size),
            **vocabulary_report,
            "init": "target's first layers" if settings.size == PREFIX else settings.init,
            "steps": outcome.step,
            "training_tokens": sum(sequence.reply_length for sequence in train_data),
            "train_loss": outcome.recent_loss,
            "heldout_positions": final["positions"],
            "heldout_kl_initial": outcome.initial_heldout["kl"],
            "heldout_kl": final["kl"],
            "heldout_agreement_initial": outcome.initial_heldout["agreement"],
            "heldout_agreement": final["agreement"],
            "training_tokens_per_s": outcome.tokens_per_s or None,
            **generation_report,
            **_forward_costs(trainer.draft, target),
        }
        (self.out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2), encoding="utf-8")
        return Outcome("finished", outcome.step, outcome.total_steps, report)

    def _train_eagle3(
        self, target: LoadedModel, train_data, heldout_data, generation_report: dict, should_stop, progress, message, max_steps,
    ) -> Outcome:
        """Record the target's features, train the head with training-time test, write it."""
        settings, eagle = self.settings, self.settings.eagle3
        vocabulary = self._eagle3_vocabulary(train_data, target)
        head = build_head(target.model, vocabulary, seed=eagle.seed, start=eagle.start)
        # The features come from the runtime chats run the target on, so the head learns the
        # features it will read: on a CPU where a pair of this target would load (the demo on
        # the native int8 forward, which also reads them ~4x faster than llama.cpp here; a
        # GGUF target otherwise on llama.cpp; what `tandem tune` chose, where it measured).
        recorder = _chat_placed(settings.target) if target.device.type == "cpu" else target
        for split, data in (("heldout", heldout_data), ("train", train_data)):
            done = _Counter(f"{split} features", sum(len(sequence.token_ids) for sequence in data), progress)
            if not record_features(recorder, self.work_dir, split, head.config.layer_ids, should_stop, done.add):
                return Outcome("stopped")
        if recorder is not target:
            recorder.close()
        trainer = Eagle3Trainer(
            head, target.model.get_input_embeddings().weight,
            (train_data, load_features(self.work_dir, "train")), (heldout_data, load_features(self.work_dir, "heldout")),
            eagle, self.work_dir, target.device,
        )
        if trainer.resume():
            message(f"Resuming training at step {trainer.step} of {trainer.total_steps}.")
        progress(Progress("training", trainer.step, trainer.total_steps))
        outcome = trainer.run(should_stop, lambda step, total, loss: progress(Progress("training", step, total, loss)), max_steps)
        if not outcome["finished"]:
            return Outcome("stopped" if should_stop() else "paused", outcome["step"], outcome["total_steps"])
        message("Scoring the head and writing it…")
        final = trainer.evaluate()
        save_head(trainer.head.float(), self.out_dir)
        report = {
            "target": settings.target,
            "kind": "eagle3",
            "layer_ids": list(head.config.layer_ids),
            "draft_vocabulary": head.config.draft_vocab_size,
            "parameters": sum(parameter.numel() for parameter in trainer.head.parameters()),
            "ttt_steps": eagle.ttt_steps,
            "epochs": eagle.epochs,
            "steps": outcome["step"],
            "training_tokens": sum(len(sequence.token_ids) for sequence in train_data),
            "training_reply_tokens": sum(sequence.reply_length for sequence in train_data),
            "train_loss": outcome["train_loss"],
            "training_tokens_per_s": outcome["tokens_per_s"],
            "heldout_initial": trainer.initial_heldout,
            "heldout": final,
            **generation_report,
        }
        (self.out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2), encoding="utf-8")
        return Outcome("finished", outcome["step"], outcome["total_steps"], report)

    def _eagle3_vocabulary(self, train_data, target: LoadedModel) -> ReducedVocabulary:
        """The head's draft vocabulary, chosen once from the training replies and kept, so a
        resumed run trains the same head."""
        path = self.work_dir / EAGLE3_VOCABULARY_FILE
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            return ReducedVocabulary(tuple(data["kept_ids"]), data["full_size"])
        vocabulary = choose_vocabulary(train_data, self.settings.eagle3.draft_vocabulary, target.tokenizer, target.model.config.vocab_size)
        path.write_text(json.dumps({"kept_ids": list(vocabulary.kept_ids), "full_size": vocabulary.full_size}), encoding="utf-8")
        return vocabulary

    def _shape(self, target: LoadedModel) -> DraftShape:
        if self.settings.size == PREFIX:
            return prefix_shape(target.model.config, self.settings.layers)
        return PRESETS[self.settings.size]

    def _data_complete(self) -> bool:
        return (self.work_dir / DATA_DONE_FILE).exists()

    def _reply_writer(self, target: LoadedModel, message: Callable[[str], None]) -> BatchReplyWriter:
        """The one reply writer over the runtime whose sequence batch suits the target: the
        native int8 forward where the target runs on it (the replies chats would sample, 7.3×
        llama.cpp's batches here: docs/BENCHMARKS.md), else llama.cpp where the target has a
        GGUF file and runs on the CPU (3× batched torch there); batched torch elsewhere (a
        GPU's batch is nearly free)."""
        generation = self.settings.generation
        sequence_tokens = MAX_PROMPT_TOKENS + generation.max_new_tokens
        if target.device.type == "cpu":
            # `target` is the bf16 model training reads; replies come from the one chats run
            placed = _chat_placed(self.settings.target)
            if native_refusal(placed) is None:
                message(f"Writing replies with the native int8 forward, {generation.batch_size} at a time.")
                return BatchReplyWriter(native_batch(placed, generation.batch_size, sequence_tokens), on_close=placed.close)
            placed.close()
        spec = ModelSpec(self.settings.target)
        # Not where llama.cpp must keep out of this process (llamacpp_process.wanted): the
        # batch writer drives llama.cpp here.
        on_llamacpp = target.device.type == "cpu" and not llamacpp_process.wanted()
        gguf = runtime_gguf(spec, "auto") if on_llamacpp else None
        if gguf is None:
            message(f"Writing replies with torch on {target.device.type}, {generation.batch_size} at a time.")
            return BatchReplyWriter(torch_batch(target, generation.batch_size))
        # F16 holds a Q4/Q8 file's weights exactly and batches faster than Q8_0 on a CPU.
        gguf = llamacpp_library.quantised_copy(gguf, "fp16")
        message(f"Writing replies with llama.cpp ({gguf.name}), {generation.batch_size} at a time.")
        return BatchReplyWriter(LlamaCppSequenceBatch(gguf, generation.batch_size, sequence_tokens))

    def _prompts(self, writer, target, should_stop, progress) -> list[str] | None:
        """The prompts file's prompts, then as many as asked for that the target wrote itself."""
        given = read_prompts(Path(self.settings.prompts))
        count = self.settings.synthetic_prompts
        if not count:
            return given
        written = _Counter("prompts", count, progress)
        synthetic = synthesize_prompts(
            writer, target.tokenizer, count, self.work_dir, self.settings.generation.seed,
            target.stop_token_ids, given, should_stop, written.add,
        )
        self._log_generation("prompts", written, None)
        return None if synthetic is None else given + synthetic

    def _log_generation(self, phase: str, counter: _Counter, sampled_mass: float | None) -> None:
        """One line per invocation and phase, so that a run stopped and resumed still
        reports what its data cost in all."""
        if counter.new_tokens:
            entry = {"phase": phase, "new": counter.new_tokens, "seconds": counter.seconds(), "sampled_mass": sampled_mass}
            with (self.work_dir / GENERATION_LOG).open("a", encoding="utf-8") as log:
                log.write(json.dumps(entry) + "\n")

    def _generation_summary(self) -> dict[str, Any]:
        path = self.work_dir / GENERATION_LOG
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
        summary: dict[str, Any] = {}
        for phase in ("prompts", "heldout", "train"):
            mine = [entry for entry in entries if entry["phase"] == phase]
            new, seconds = sum(entry["new"] for entry in mine), sum(entry["seconds"] for entry in mine)
            if not new:
                continue
            summary[f"{phase}_generation"] = {"written": new, "seconds": seconds, "per_s": new / seconds if seconds else None}
            weighted = [(entry["sampled_mass"], entry["new"]) for entry in mine if entry["sampled_mass"] is not None]
            if weighted:
                summary[f"{phase}_generation"]["sampled_mass"] = sum(mass * count for mass, count in weighted) / sum(count for _, count in weighted)
        return summary

    def _save_draft(self, draft: torch.nn.Module, target: LoadedModel, vocabulary: ReducedVocabulary | None) -> None:
        # Stored in bf16: half the file (the demo draft must ship in under 40 MB); it runs in
        # whatever precision its pair asks for.
        copy.deepcopy(draft).to(torch.bfloat16).save_pretrained(self.out_dir)
        if vocabulary is not None:
            vocabulary.save(self.out_dir)
        source = resolve_source(ModelSpec(self.settings.target))
        copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
        for name in copied:
            shutil.copy(source / name, self.out_dir / name)
        if not copied:  # a tokenizer kept in some other form: let transformers write it
            target.tokenizer.save_pretrained(self.out_dir)
        check_pair_compatible(target.tokenizer, load_tokenizer_only(ModelSpec(str(self.out_dir))))
        try:
            export_gguf(self.out_dir, precision=DRAFT_PRECISION)  # so that the llama.cpp runtime can run the draft too
        except ModelLoadError as error:  # a tokenizer GGUF export cannot write: torch still runs it
            print(f"tandem distill: no GGUF written ({error})", file=sys.stderr)


class _Counter:
    """Turns a split's token counts into progress updates and a tokens/s figure."""

    def __init__(self, phase: str, total: int, progress: Callable[[Progress], None]):
        self.phase, self.total, self.progress = phase, total, progress
        self.done = 0
        self.new_tokens = 0
        self.started: float | None = None

    def add(self, tokens: int) -> None:
        if self.started is None:  # the first call reports what earlier runs left
            self.started = time.perf_counter()
        else:
            self.new_tokens += tokens
        self.done += tokens
        self.progress(Progress(self.phase, min(self.done, self.total), self.total))

    def seconds(self) -> float:
        return time.perf_counter() - self.started if self.started is not None else 0.0


def _forward_costs(draft: torch.nn.Module, target: LoadedModel) -> dict[str, float]:
    """One decode step of each, in the target's precision, with a 200-token cache."""
    context = min(200, target.context_length - 2)
    timed_draft = copy.deepcopy(draft).to(dtype=target.dtype).eval()
    target_ms = forward_ms(target.model, context)
    draft_ms = forward_ms(timed_draft, context)
    return {"target_forward_ms": target_ms, "draft_forward_ms": draft_ms, "forward_cost_ratio": draft_ms / target_ms}
