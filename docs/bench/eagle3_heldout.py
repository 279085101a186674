"""EAGLE-3 heads scored on one held-out set: per drafted depth, how often the head's first
choice is the target's (Eagle3Trainer.evaluate, the figure `tandem distill` reports), so that
heads trained on different data are compared on the same replies and features.

  PYTHONPATH=. python3 docs/bench/eagle3_heldout.py [--shipped-prompts-only] WORK_DIR HEAD [HEAD ...]

--shipped-prompts-only keeps the replies to the shipped prompts file's prompts: every run holds
out the same ones (split_prompts goes by index, and the file's prompts come first), while
the synthetic prompts a run writes for itself differ from run to run and may be another
run's training prompts.

WORK_DIR: a distillation's work folder holding `heldout-*.pt` and their recorded features
(the target's features as that run's recorder read them).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from engine.chat_prompt import Message, encode_conversation
from engine.config import ModelSpec
from engine.models import load_model
from engine.prompts import DISTILL_PROMPTS, read_prompts
from engine.runtime.eagle3_head import load_head
from engine.tools.distill.data import load_split
from engine.tools.distill.eagle3 import Eagle3Settings, Eagle3Trainer, load_features


def main() -> None:
    arguments = sys.argv[1:]
    shipped_only = "--shipped-prompts-only" in arguments
    arguments = [argument for argument in arguments if argument != "--shipped-prompts-only"]
    work_dir, heads = Path(arguments[0]), [Path(arg) for arg in arguments[1:]]
    target = load_model(ModelSpec("demo-target", "bf16", "cpu"), runtime="torch")
    heldout = (load_split(work_dir, "heldout"), load_features(work_dir, "heldout"))
    if shipped_only:
        shipped = {tuple(encode_conversation(target.tokenizer, [Message("user", prompt)])) for prompt in read_prompts(DISTILL_PROMPTS)}
        kept = [index for index, sequence in enumerate(heldout[0]) if tuple(sequence.token_ids[: sequence.prompt_length].tolist()) in shipped]
        heldout = ([heldout[0][index] for index in kept], [heldout[1][index] for index in kept])
        print(f"{len(kept)} of the held-out replies answer shipped prompts")
    embeddings = target.model.get_input_embeddings().weight
    for folder in heads:
        with tempfile.TemporaryDirectory() as scratch:
            trainer = Eagle3Trainer(load_head(folder), embeddings, heldout, heldout, Eagle3Settings(), Path(scratch), torch.device("cpu"))
            scores = trainer.evaluate()
        print(f"{folder}: " + "  ".join(f"depth {depth + 1} {score['agreement']:.3f}" for depth, score in enumerate(scores))
              + f"  ({scores[0]['positions']:,} positions)", flush=True)


if __name__ == "__main__":
    main()
