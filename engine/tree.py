"""Token trees: drafted continuations that share prefixes, verified in one target forward
(ALGORITHMS.md §3a).

Node 0 is the root: the last committed token. Every other node is a drafted token whose
parent comes before it, so a node's index is also its order in the verifying forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .runtime import ModelRuntime
from .sampling import Sampler


@dataclass
class TokenTree:
    tokens: list[int]
    parents: list[int]  # parents[0] is -1
    depths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.depths:
            self.depths = [0] + [0] * (len(self.tokens) - 1)
            for node in range(1, len(self.tokens)):
                self.depths[node] = self.depths[self.parents[node]] + 1
        self._children: list[dict[int, int]] = [{} for _ in self.tokens]
        for node in range(1, len(self.tokens)):
            parent = self.parents[node]
            if not 0 <= parent < node:
                raise ValueError("every node's parent must come before it")
            if self.tokens[node] in self._children[parent]:
                raise ValueError("siblings must hold different tokens")
            self._children[parent][self.tokens[node]] = node

    @classmethod
    def chain(cls, root_token: int, tokens: list[int]) -> TokenTree:
        return cls([root_token, *tokens], list(range(-1, len(tokens))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def drafted(self) -> int:
        return len(self.tokens) - 1

    @property
    def depth(self) -> int:
        return max(self.depths)

    def child_with_token(self, node: int, token: int) -> int | None:
        return self._children[node].get(token)

    def child_count(self, node: int) -> int:
        return len(self._children[node])

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node` (empty for the root)."""
        nodes = []
        while node > 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def ancestry(self) -> torch.Tensor:
        """(N, N) bool: [i, j] is True when j is i or an ancestor of i."""
        seen = torch.zeros(len(self), len(self), dtype=torch.bool)
        for node in range(len(self)):
            parent = self.parents[node]
            if parent >= 0:
                seen[node] = seen[parent]
            seen[node, node] = True
        return seen


def forward_tree(model: ModelRuntime, context: list[int], tree: TokenTree) -> torch.Tensor:
    """Run the tree through `model` after `context` (whose last token is the root) in one
    forward: (N, V) logits, row i giving the next-token distribution after node i.

    The model's cache first loses whatever it holds past the longest prefix shared with
    `context`; the uncached rest of `context` runs causally, and each drafted node sees the
    context and its own ancestors, at position len(context) - 1 + depth. Afterwards drafted
    node i sits in cache slot len(context) - 1 + i; see `keep_path`.
    """
    if tree.tokens[0] != context[-1]:
        raise ValueError("the tree's root must be the context's last token")
    pending = model.pending(context)  # at least the root
    past = len(model)
    root_slot = len(context) - 1
    parents = list(range(past - 1, past - 1 + len(pending)))  # the pending context: a chain
    parents += [root_slot + tree.parents[node] for node in range(1, len(tree))]
    return model.forward_tree(pending + tree.tokens[1:], parents, logits_wanted=len(tree))


def keep_path(model: ModelRuntime, context_length: int, path: list[int]) -> None:
    """After `forward_tree`, keep the cache entries of the accepted `path` and drop the rest."""
    model.keep_slots(context_length, [context_length - 1 + node for node in path])


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted drafted nodes, from depth 1 down
    next_token: int  # the target's own token after them


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """From the root, follow the child whose token is the target's argmax; when no child
    matches, that argmax is the next token. The output is the target's own greedy output."""
    best = torch.argmax(target_logits, dim=-1).tolist()
    return _walk(tree, lambda node: best[node])


def verify_tree_sampled(tree: TokenTree, target_logits: torch.Tensor, sampler: Sampler) -> TreeVerdict:
    """Exact at any temperature, top-k and top-p: draw one token from the target's
    distribution at each visited node; follow the child holding it, or emit it and stop.
    Every emitted token is a plain target sample, so the output is distributed as the
    target's; the tree only decides how many of them one forward yields. (With distinct
    deterministic children this accepts exactly as often as recursive rejection would.)"""
    return _walk(tree, lambda node: sampler.draw(sampler.probabilities(target_logits[node][None])[0]))


def _walk(tree: TokenTree, next_token_at) -> TreeVerdict:
    node, path = 0, []
    while True:
        token = next_token_at(node)
        child = tree.child_with_token(node, token)
        if child is None:
            return TreeVerdict(path, token)
        path.append(child)
        node = child
