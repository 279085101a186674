"""Token trees: drafted continuations that share prefixes, verified in one target forward
(ALGORITHMS.md §3a).

Node 0 is the root: the last committed token. Every other node is a drafted token whose
parent comes before it, so a node's index is also its order in the verifying forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .runtime import ModelRuntime


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

    @property
    def is_chain(self) -> bool:
        """Whether the tree is one branch: node i follows node i - 1."""
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def child_with_token(self, node: int, token: int) -> int | None:
        return self._children[node].get(token)

    def child_count(self, node: int) -> int:
        return len(self._children[node])

    def children(self, node: int) -> list[int]:
        """`node`'s children in the order they were drafted (a drafter's likeliest first)."""
        return list(self._children[node].values())

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


def forward_tree(model: ModelRuntime, context: list[int], tree: TokenTree, first_row: int = 0) -> torch.Tensor:
    """Run the tree through `model` after `context` (whose last token is the root) in one
    forward: (N - first_row, V) logits, row i giving the next-token distribution after node
    first_row + i (a verifier that checks no earlier node needs no LM head over them).

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
    return model.forward_tree(pending + tree.tokens[1:], parents, logits_wanted=len(tree) - first_row)


def keep_path(model: ModelRuntime, context_length: int, path: list[int]) -> None:
    """After `forward_tree`, keep the cache entries of the accepted `path` and drop the rest."""
    model.keep_slots(context_length, [context_length - 1 + node for node in path])


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted drafted nodes, from depth 1 down
    next_token: int | None  # the target's own token after them; None when the target did not run
