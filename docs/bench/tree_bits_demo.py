"""Trees on the demo target against plain steps, bit for bit (issue 20's exactness; the native
attention's ranges, docs/BENCHMARKS.md).

After a random 100-token context, ROUNDS rounds: a random tree of 24 drafted nodes verified
in one forward, then the cache cropped back and the path to its last node (the node after all
its siblings in the cache) run again as one-token steps. Greedy speculation equals plain
decoding only if every node's logits equal its step's exactly. Prints how many nodes were
compared, how many trees had the last node's cache row and its position on two sides of an
attention range's border (128 rows), and how many nodes' logits differed.

  PYTHONPATH=. .venv/bin/python docs/bench/tree_bits_demo.py [SEED]
"""
from __future__ import annotations

import dataclasses
import random
import sys

import torch

from engine.pairs import find_pair
from engine.session import load_pair
from engine.tree import TokenTree, forward_tree

ROUNDS = 40
NODES = 24
RANGE_ROWS = 128  # decoder_forward.c


def random_tree(rng: random.Random, root: int, size: int, vocab: int) -> TokenTree:
    tokens, parents = [root], [-1]
    for _ in range(size):
        parents.append(rng.randrange(len(tokens)))
        tokens.append(rng.randrange(vocab))
    return TokenTree(tokens, parents)


def main() -> None:
    rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    pair = load_pair(dataclasses.replace(find_pair("demo"), draft=None, runtime="torch"), lambda message, fraction: None)
    target = pair.target_runner
    vocab = target.vocab_size
    context = [rng.randrange(vocab) for _ in range(100)]
    target.forward(context, logits_wanted=1)
    compared = straddling = differing = 0
    for _ in range(ROUNDS):
        tree = random_tree(rng, context[-1], NODES, vocab)
        logits = forward_tree(target, context, tree)
        path = tree.path(len(tree) - 1)
        last_row, last_position = len(context) - 1 + path[-1], len(context) - 1 + len(path)
        straddling += last_row // RANGE_ROWS != last_position // RANGE_ROWS
        target.crop(len(context))
        for node in path:
            compared += 1
            differing += not torch.equal(target.forward([tree.tokens[node]])[-1], logits[node])
        context = context + [tree.tokens[node] for node in path]
    print(f"runtime: {target.name}; context {len(context)} tokens after {ROUNDS} trees of {NODES} nodes")
    print(f"nodes compared {compared}, trees across a range border {straddling}, nodes whose logits differ {differing}")


if __name__ == "__main__":
    main()
