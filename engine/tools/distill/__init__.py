"""`tandem distill`: train a small draft model for a target that has no small sibling, by
distillation from the target's own replies.

data.py      the target writes the training data (replies + top-k log-probs), in shards
model.py     draft presets, their initialisation, and the decode-step timing behind them
train.py     KL + cross-entropy training with checkpoints
pipeline.py  one run in an output folder, resumable at every phase
command.py   the `distill` subcommand (arguments, progress bars, Ctrl-C)
"""
