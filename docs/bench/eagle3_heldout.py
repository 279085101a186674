"""EAGLE-3 heads scored on one held-out set: per drafted depth, how often the head's first
choice is the target's (Eagle3Trainer.evaluate, the figure `tandem distill` reports), so that
heads trained on different data are compared on the same replies and features.

  PYTHONPATH=. python3 docs/bench/eagle3_heldout.py WORK_DIR HEAD [HEAD ...]

WORK_DIR: a distillation's work folder holding `heldout-*.pt` and their recorded features
(the target's features as that run's recorder read them).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from engine.config import ModelSpec
from engine.models import load_model
from engine.runtime.eagle3_head import load_head
from engine.tools.distill.data import load_split
from engine.tools.distill.eagle3 import Eagle3Settings, Eagle3Trainer, load_features


def main() -> None:
    work_dir, heads = Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]]
    target = load_model(ModelSpec("demo-target", "bf16", "cpu"), runtime="torch")
    heldout = (load_split(work_dir, "heldout"), load_features(work_dir, "heldout"))
    embeddings = target.model.get_input_embeddings().weight
    for folder in heads:
        with tempfile.TemporaryDirectory() as scratch:
            trainer = Eagle3Trainer(load_head(folder), embeddings, heldout, heldout, Eagle3Settings(), Path(scratch), torch.device("cpu"))
            scores = trainer.evaluate()
        print(f"{folder}: " + "  ".join(f"depth {depth + 1} {score['agreement']:.3f}" for depth, score in enumerate(scores))
              + f"  ({scores[0]['positions']:,} positions)", flush=True)


if __name__ == "__main__":
    main()
