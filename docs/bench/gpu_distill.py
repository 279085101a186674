"""`tandem distill --kind eagle3` inside a fixed time, for a lent GPU (issue 20: acceptance
against data size; the data written on the device, where a CPU writes ~230 tokens/s).

A lease is minutes long and no rate on the GPU is measured yet, so this drives the same
`Distillation` the command runs and sizes the run from rates it measures as it goes:

1. The target's feature forward is timed first (also a check that it works on the device
   before minutes go into data).
2. Replies are written until the time left only just covers recording their features; the
   run's token budget is then set to what was written, and the run resumed (the replies
   already written are kept, as on any `--resume`).
3. Training runs PROBE_STEPS steps, is timed, and its epochs are set so that it ends in the
   time left (at most MAX_EPOCHS), then resumed from its checkpoint.

Everything the run decides is printed, and the report is the command's own.

  PYTHONPATH=. python3 docs/bench/gpu_distill.py OUT SECONDS [--device cuda] [--target demo-target]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from engine.config import ModelSpec
from engine.models import load_model
from engine.tools.distill.data import GenerationSettings, load_split
from engine.runtime.eagle3_head import default_layer_ids
from engine.tools.distill.eagle3 import Eagle3Settings
from engine.tools.distill.pipeline import RUN_FILE, TARGET_PRECISION, WORK_FOLDER, Distillation, Progress, RunSettings

PROBE_STEPS = 40
MAX_EPOCHS = 4.0
TRAINING_SHARE = 0.35  # of the whole time, kept for training and scoring
PROMPT_TOKENS_PER_REPLY_TOKEN = 0.35  # features cover the prompt too (measured on the CPU run's data: 1.33M / 1.03M - 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--target", default="demo-target")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--synthetic-prompts", type=int, default=6000)
    parser.add_argument("--head-batch", type=int, default=16)
    args = parser.parse_args()
    started = time.monotonic()
    end = started + args.seconds
    data_end = started + args.seconds * (1 - TRAINING_SHARE)

    feature_rate = time_features(args.target, args.device)
    say(started, f"features: {feature_rate:,.0f} tokens/s")

    settings = RunSettings(
        target=args.target, tokens=50_000_000, heldout_tokens=10_000, synthetic_prompts=args.synthetic_prompts, kind="eagle3",
        generation=GenerationSettings(batch_size=args.batch_size),
        eagle3=Eagle3Settings(batch_size=args.head_batch, epochs=MAX_EPOCHS),
    )
    run = Distillation.start(args.out, settings, device=args.device)
    phase = {"name": "", "since": time.monotonic(), "done": 0, "first": 0}

    def features_seconds(reply_tokens: int) -> float:
        return reply_tokens * (1 + PROMPT_TOKENS_PER_REPLY_TOKEN) / feature_rate

    def progress(update: Progress) -> None:
        if update.phase != phase["name"]:
            say(started, f"{update.phase}: from {update.done:,} of {update.total:,}")
            phase.update(name=update.phase, since=time.monotonic(), first=update.done)
        phase["done"] = update.done

    def data_should_stop() -> bool:
        # replies only while the time left still covers their features (held-out ones included)
        if phase["name"] != "training data":
            return False
        return time.monotonic() + features_seconds(phase["done"] + settings.heldout_tokens) >= data_end

    outcome = run.run(should_stop=data_should_stop, progress=progress, message=lambda text: say(started, text), max_steps=PROBE_STEPS)
    if outcome.status == "stopped":
        written = sum(sequence.reply_length for sequence in load_split(run.work_dir, "train"))
        rate = (phase["done"] - phase["first"]) / (time.monotonic() - phase["since"])
        say(started, f"replies stopped at {written:,} tokens ({rate:,.0f} tokens/s); the run's budget set to that")
        settings = dataclasses.replace(settings, tokens=written)
        rewrite(run, settings)
        run = Distillation.resume(args.out, device=args.device)
        probe_start = {}

        def mark(update: Progress) -> None:
            progress(update)
            if update.phase == "training" and update.done > 0 and "step" not in probe_start:
                probe_start.update(step=update.done, at=time.monotonic())
            if update.phase == "training":
                probe_start["last"], probe_start["last_at"] = update.done, time.monotonic()

        outcome = run.run(progress=mark, message=lambda text: say(started, text), max_steps=PROBE_STEPS)
        progress_times = probe_start
    else:
        raise SystemExit(f"the data phase ended as {outcome.status!r}; expected it to be stopped by time")
    if outcome.status != "paused":
        raise SystemExit(f"training ended as {outcome.status!r} before its probe")
    steps = progress_times["last"] - progress_times["step"]
    per_step = (progress_times["last_at"] - progress_times["at"]) / max(steps, 1)
    sequences = len(load_split(run.work_dir, "train"))
    affordable = progress_times["last"] + (end - time.monotonic() - 20) / per_step  # 20 s: scoring and writing the head
    epochs = max(progress_times["last"] * args.head_batch / sequences, min(MAX_EPOCHS, affordable * args.head_batch / sequences))
    say(started, f"training: {per_step * 1000:.1f} ms a step of {args.head_batch} sequences; {sequences:,} sequences; {epochs:.2f} epochs fit")
    settings = dataclasses.replace(settings, eagle3=dataclasses.replace(settings.eagle3, epochs=round(epochs, 2)))
    rewrite(run, settings)
    run = Distillation.resume(args.out, device=args.device)
    outcome = run.run(progress=progress, message=lambda text: say(started, text))
    say(started, f"finished: {outcome.status}")
    if outcome.report:
        print(json.dumps({key: outcome.report[key] for key in ("training_reply_tokens", "epochs", "steps", "heldout", "training_tokens_per_s")}, indent=1))


def time_features(target_name: str, device: str) -> float:
    """Tokens/s of the target's forward over a 330-token sequence with the head's feature layers."""
    target = load_model(ModelSpec(target_name, TARGET_PRECISION, device), runtime="torch")
    runtime = target.open_runtime(feature_layers=default_layer_ids(target.model.config.num_hidden_layers))
    ids = torch.randint(100, 10_000, (330,), generator=torch.Generator().manual_seed(0)).tolist()
    try:
        for _ in range(2):
            runtime.reset()
            runtime.forward(ids, logits_wanted=1)
        began = time.perf_counter()
        for _ in range(5):
            runtime.reset()
            runtime.forward(ids, logits_wanted=1)
            runtime.features.to(torch.float16).numpy()
        return 5 * len(ids) / (time.perf_counter() - began)
    finally:
        runtime.close()
        target.close()


def rewrite(run: Distillation, settings: RunSettings) -> None:
    (run.out_dir / WORK_FOLDER / RUN_FILE).write_text(json.dumps(settings.to_dict(), indent=2), encoding="utf-8")


def say(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)


if __name__ == "__main__":
    main()
