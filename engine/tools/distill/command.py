"""`tandem distill`: the command-line face of a distillation run — arguments, progress bars,
Ctrl-C, and the closing summary. The work itself is in `pipeline.py`."""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ...config import DEVICES, ConfigError
from .data import GenerationSettings
from .model import DEFAULT_PREFIX_LAYERS, INITS, PREFIX, SIZES
from .eagle3 import HEAD_STARTS, Eagle3Settings
from .pipeline import DEFAULT_PROMPTS, DEFAULT_TOKENS, KINDS, Distillation, Progress, RunSettings, default_heldout_tokens
from .train import TrainSettings

INTERRUPTED_EXIT_CODE = 130  # what shells report for a program ended by Ctrl-C


def add_distill_command(subparsers: Any) -> None:
    """Register `distill` on the `tandem` command's subparsers."""
    parser = subparsers.add_parser(
        "distill",
        help="train a small draft model for a target, by distillation from the target",
        description="Let the target answer a shipped set of prompts, then train a small model with "
        "the target's tokenizer to predict the target's next-token distributions. The output folder "
        "ends up holding a Hugging Face model to use as the draft of a pair.",
    )
    parser.add_argument("--target", help="the target: demo-target, a model folder, a .gguf file or a repo id")
    parser.add_argument(
        "--kind", choices=KINDS,
        help="what to train: draft, a small model (default), or eagle3, an EAGLE-3 head that drafts from the "
        "target's own features (public EAGLE-3 layout; a pair uses it for the eagle and eagle-tree methods)",
    )
    parser.add_argument(
        "--ttt-steps", type=int, metavar="N",
        help="with --kind eagle3: how deep training-time test unrolls the head on its own outputs (default: 3)",
    )
    parser.add_argument(
        "--head-start", choices=HEAD_STARTS,
        help="with --kind eagle3: the head's decoder layer starts random, as in EAGLE-3 (default), or as the "
        "target's last layer",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder: the draft, report.json and the run's work files")
    parser.add_argument(
        "--size", choices=SIZES,
        help=f"draft shape (default: small, 4 layers × 256 trained from scratch; {PREFIX}: the target's own first "
        "--layers layers at its width, started from its weights, which learns far faster; tiny is for tests)",
    )
    parser.add_argument(
        "--layers", type=int, metavar="N",
        help=f"with --size {PREFIX}: how many of the target's layers the draft keeps (default: {DEFAULT_PREFIX_LAYERS})",
    )
    parser.add_argument("--tokens", type=int, help="target reply tokens to train on (default: 1,000,000 for small)")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where to run (default: auto)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from where it stopped")
    parser.add_argument("--prompts", type=Path, help="JSON Lines file with a \"prompt\" key per line (default: shipped set)")
    parser.add_argument(
        "--synthetic-prompts", type=int, metavar="N",
        help="also let the target write N prompts of its own (Magpie-style: it continues its chat template's "
        "user turn), deduplicated, beside the prompts file's (default: 0)",
    )
    parser.add_argument(
        "--batch-size", type=int, metavar="N",
        help="replies the target writes at once (default: 64; on a CPU with llama.cpp they are continuously "
        "batched, on a GPU batched torch)",
    )
    parser.add_argument(
        "--vocabulary", type=int, metavar="N",
        help="keep only the N tokens the target writes most (and one shared id for the rest) in the draft's "
        "embedding and output layer: a much cheaper draft call; exactness is unaffected (default: 0, all)",
    )
    parser.add_argument("--max-new-tokens", type=int, help="longest target reply (default: 256)")
    parser.add_argument("--epochs", type=float, help="passes over the data (default: 2)")
    parser.add_argument("--learning-rate", type=float, metavar="LR", help="peak AdamW learning rate (default: 0.002)")
    parser.add_argument("--init", choices=INITS, help="draft embeddings: pca of the target's (default) or random")
    parser.add_argument("--seed", type=int, help="seed for sampling and training (default: 0)")
    parser.add_argument("--stop-after-steps", type=int, metavar="N", help="pause after training step N; continue with --resume")
    parser.set_defaults(run=run_distill)


def run_distill(args: argparse.Namespace) -> int:
    out_dir = args.out.expanduser().resolve()
    if args.resume:
        distillation = Distillation.resume(out_dir, args.device)
        _check_unchanged(args, distillation.settings)
    else:
        if not args.target:
            raise ConfigError("--target is required (unless --resume continues an earlier run)")
        distillation = Distillation.start(out_dir, _settings_from_args(args), args.device)
    settings = distillation.settings
    size = f"{settings.size} ({settings.layers}-layer)" if settings.size == PREFIX else settings.size
    what = "an EAGLE-3 head" if settings.kind == "eagle3" else f"a {size} draft"
    epochs = settings.eagle3.epochs if settings.kind == "eagle3" else settings.training.epochs
    print(
        f"Distilling {what} from {settings.target} into {out_dir}: "
        f"{settings.tokens:,} reply tokens from the target, then {epochs:g} epochs of training.",
        file=sys.stderr,
    )
    resume_hint = f"tandem distill --target {shlex.quote(settings.target)} --out {shlex.quote(str(out_dir))} --resume"
    bars = _Bars()
    try:
        with _stop_on_ctrl_c() as stop, bars:
            outcome = distillation.run(stop.is_set, bars.update, bars.say, args.stop_after_steps)
    except KeyboardInterrupt:  # a second Ctrl-C, which does not wait for the step to end
        print(
            f"\nStopped at once; the data shards and the last checkpoint are kept. Continue with:\n  {resume_hint}",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT_CODE
    if outcome.status == "stopped":
        where = f"at training step {outcome.step} of {outcome.total_steps}" if outcome.total_steps else "while generating data"
        print(f"Stopped {where}; everything so far is saved. Continue with:\n  {resume_hint}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    if outcome.status == "paused":
        print(f"Paused at training step {outcome.step} of {outcome.total_steps}. Continue with:\n  {resume_hint}", file=sys.stderr)
        return 0
    report = outcome.report or {}
    (_print_eagle3_report if report.get("kind") == "eagle3" else _print_report)(report, out_dir)
    return 0


def _settings_from_args(args: argparse.Namespace) -> RunSettings:
    size = args.size or "small"
    if args.layers is not None and size != PREFIX:
        raise ConfigError(f"--layers is for --size {PREFIX}; a {size} draft has a fixed shape")
    tokens = args.tokens if args.tokens is not None else DEFAULT_TOKENS[size]
    return RunSettings(
        target=_target_source(args.target),
        size=size,
        tokens=tokens,
        heldout_tokens=default_heldout_tokens(tokens),
        init=args.init or "pca",
        **_given(layers=args.layers),
        prompts=str(args.prompts.expanduser().resolve()) if args.prompts else str(DEFAULT_PROMPTS),
        synthetic_prompts=args.synthetic_prompts or 0,
        vocabulary=args.vocabulary or 0,
        generation=GenerationSettings(**_given(max_new_tokens=args.max_new_tokens, seed=args.seed, batch_size=args.batch_size)),
        training=TrainSettings(**_given(epochs=args.epochs, seed=args.seed, learning_rate=args.learning_rate)),
        kind=args.kind or "draft",
        eagle3=Eagle3Settings(**_given(
            ttt_steps=args.ttt_steps, start=args.head_start, epochs=args.epochs, seed=args.seed, learning_rate=args.learning_rate,
            draft_vocabulary=args.vocabulary,
        )),
    )


def _given(**values: Any) -> dict[str, Any]:
    """The options the user gave; the others keep the settings' defaults."""
    return {name: value for name, value in values.items() if value is not None}


def _target_source(source: str) -> str:
    # A relative path is made absolute, so that --resume works from any folder.
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def _check_unchanged(args: argparse.Namespace, settings: RunSettings) -> None:
    """A resumed run keeps its settings; a flag that asks for different ones is an error."""
    given = {
        "--target": (args.target and _target_source(args.target), settings.target),
        "--kind": (args.kind, settings.kind),
        "--ttt-steps": (args.ttt_steps, settings.eagle3.ttt_steps),
        "--head-start": (args.head_start, settings.eagle3.start),
        "--size": (args.size, settings.size),
        "--tokens": (args.tokens, settings.tokens),
        "--init": (args.init, settings.init),
        "--layers": (args.layers, settings.layers),
        "--learning-rate": (args.learning_rate, settings.training.learning_rate),
        "--prompts": (args.prompts and str(args.prompts.expanduser().resolve()), settings.prompts),
        "--synthetic-prompts": (args.synthetic_prompts, settings.synthetic_prompts),
        "--batch-size": (args.batch_size, settings.generation.batch_size),
        "--vocabulary": (args.vocabulary, settings.vocabulary),
        "--max-new-tokens": (args.max_new_tokens, settings.generation.max_new_tokens),
        "--epochs": (args.epochs, settings.training.epochs),
        "--seed": (args.seed, settings.generation.seed),
    }
    for flag, (asked, saved) in given.items():
        if asked is not None and asked != saved:
            raise ConfigError(f"{flag} {asked} differs from the run being resumed ({saved}); leave it out, or start a new run in another folder")


@contextmanager
def _stop_on_ctrl_c() -> Iterator[threading.Event]:
    """The first Ctrl-C asks the run to stop after the current step and save a checkpoint
    (an exception in the middle of an optimizer step could leave a half-updated model)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be set from the main thread
        return

    def request_stop(signum: int, frame: Any) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C ends it at once
        print("\nStopping after the current step (Ctrl-C again to stop at once)…", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, request_stop)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


class _Bars:
    """One tqdm bar per phase, with ETA; the training bar also shows the loss."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.bar: tqdm | None = None

    def update(self, progress: Progress) -> None:
        if progress.phase != self.phase:
            self.close()
        bar = self.bar or self._open(progress)
        bar.update(progress.done - bar.n)
        if progress.loss is not None:
            bar.set_postfix(loss=f"{progress.loss:.3f}", refresh=False)

    def say(self, text: str) -> None:
        self.close()  # a message between phases, not under a half-drawn bar
        print(text, file=sys.stderr)

    def _open(self, progress: Progress) -> tqdm:
        unit = {"training": "step", "prompts": "prompt"}.get(progress.phase, "tok")
        self.bar = tqdm(total=progress.total, initial=progress.done, desc=progress.phase, unit=unit, unit_scale=unit == "tok", file=sys.stderr, dynamic_ncols=True)
        self.phase = progress.phase
        return self.bar

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.phase = None, None

    def __enter__(self) -> _Bars:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _print_eagle3_report(report: dict[str, Any], out_dir: Path) -> None:
    print(f"EAGLE-3 head written to {out_dir} ({report['parameters'] / 1e6:.1f}M parameters, {report['steps']} steps, "
          f"{report['training_reply_tokens']:,} reply tokens).")
    for depth, (before, after) in enumerate(zip(report["heldout_initial"], report["heldout"]), start=1):
        print(f"  held-out agreement at depth {depth}: {before['agreement']:.1%} untrained -> {after['agreement']:.1%}")
    print(f"Use it in a pair:  tandem chat --target {shlex.quote(report['target'])} --eagle {shlex.quote(str(out_dir))} --method eagle-tree")
    print(f"The work files in {out_dir / 'distill-work'} can be deleted once you no longer want to --resume.")


def _print_report(report: dict[str, Any], out_dir: Path) -> None:
    print(f"Draft written to {out_dir} ({report['shape']['parameters'] / 1e6:.1f}M parameters, {report['steps']} steps).")
    print(f"  training loss      {report['train_loss'].get('loss', float('nan')):.3f}")
    print(f"  held-out KL        {report['heldout_kl_initial']:.3f} untrained -> {report['heldout_kl']:.3f}")
    print(f"  greedy agreement   {report['heldout_agreement_initial']:.1%} untrained -> {report['heldout_agreement']:.1%}")
    print(f"  forward cost       {report['forward_cost_ratio']:.1%} of the target's ({report['draft_forward_ms']:.1f} ms vs {report['target_forward_ms']:.1f} ms)")
    print(f"Use it as a draft:  tandem chat --target {shlex.quote(report['target'])} --draft {shlex.quote(str(out_dir))}")
    print(f"The work files in {out_dir / 'distill-work'} can be deleted once you no longer want to --resume.")
