"""`tandem calibrate --pair P`: train the pair's SPRINTER and SpecDec++ heads and say how
well they predict the target, on prompts they never saw."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .calibrate import CalibrationSettings


def add_calibrate_command(subparsers: Any) -> None:
    defaults = CalibrationSettings()
    command = subparsers.add_parser(
        "calibrate",
        help="train the pair's SPRINTER verifier and SpecDec++ head (methods sprinter and adaptive)",
        description="The target answers the shipped distillation prompts; draft and target then read each "
        "reply, and two small heads on the draft's hidden state learn whether the target accepts the "
        "draft's token. Every tenth prompt is held out for the figures printed at the end. The heads "
        "are saved for the pair in Tandem's data folder (or --out) and used by --method sprinter and adaptive.",
    )
    command.add_argument("--pair", default="demo", help="a pair name (demo, or one saved in the app) or a pair JSON file")
    command.add_argument("--runtime", choices=("auto", "torch", "llama.cpp"), help="what runs the models (default: the pair's)")
    command.add_argument("--prompts", type=int, default=defaults.prompts, help=f"how many shipped prompts to use (default: {defaults.prompts})")
    command.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help=f"reply length per prompt (default: {defaults.max_new_tokens})")
    command.add_argument("--temperature", type=float, default=defaults.temperature,
                         help=f"the target's replies and the sampled-mode heads (default: {defaults.temperature:g})")
    command.add_argument("--steps", type=int, default=defaults.training_steps, help=f"training steps per head (default: {defaults.training_steps})")
    command.add_argument("--seed", type=int, default=defaults.seed)
    command.add_argument("--out", type=Path, help="write the heads here instead of the pair's data folder")
    command.set_defaults(run=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    import dataclasses

    from tqdm import tqdm

    from ...pairs import find_pair
    from ...session import load_pair
    from .calibrate import calibrate
    from ...heads.store import user_heads_folder

    settings = CalibrationSettings(args.prompts, args.max_new_tokens, args.temperature, args.steps, args.seed)
    config = find_pair(args.pair)
    if args.runtime:
        config = dataclasses.replace(config, runtime=args.runtime)
    pair = load_pair(config, lambda message, fraction: print(f"  {message}", file=sys.stderr))
    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int) -> None:
        bar = bars.get(phase) or bars.setdefault(phase, tqdm(total=total, desc=PHASES[phase], unit="", file=sys.stderr))
        bar.update(done - bar.n)

    try:
        heads = calibrate(pair, settings, progress, out_folder=args.out)
    finally:
        for bar in bars.values():
            bar.close()
    print(f"heads saved to {args.out or user_heads_folder(config.name)}")
    print(format_card(heads.card))
    return 0


PHASES = {"replies": "target replies", "training": "training heads"}


def format_card(card: dict) -> str:
    data = card.get("data", {})
    lines = [f"{data.get('prompts')} prompts ({data.get('heldout_prompts')} held out), {data.get('reply_tokens')} reply tokens, {card.get('seconds')} s"]
    for mode, figures in card["modes"].items():
        sprinter, acceptance = figures["sprinter"], figures["acceptance"]
        lines.append(
            f"{mode:>8}: SPRINTER passes {sprinter['pass_rate']:.0%} of held-out tokens at threshold {sprinter['threshold']:.3f}, "
            f"false-positive rate (eta) {sprinter['false_positive_rate']:.3f}, {sprinter['unchecked_error_rate']:.1%} of passed tokens "
            f"would be rejected; accuracy {sprinter['accuracy']:.3f} (constant {sprinter['constant_accuracy']:.3f}); "
            f"SpecDec++ head weighted BCE {acceptance['bce']:.3f} (constant {acceptance['constant_bce']:.3f})"
        )
    return "\n".join(lines)
