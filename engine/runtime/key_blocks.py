"""How a cache keeps its keys: in rows, as torch does, or in the blocks of rows that the native
forward's AVX-512 BF16 build scores (simd.h, KEY_BLOCK_ROWS). Block b of a head holds its rows
16b .. 16b + 15, element pair p of all sixteen side by side, so that one VDPBF16PS multiplies a
query into sixteen keys, a key a lane, with no sum across lanes (that sum had cost as many
instructions as the products).

Why a module: Python touches a native key cache in three places, the static cache's row moves
(a tree's kept path), an EAGLE-3 head's growth and compaction, and the torch forward over a
cache the native forward holds. Each asks its layout here rather than indexing rows itself.
Values stay in rows.
"""
from __future__ import annotations

import torch


class KeyRows:
    """Keys (..., rows, dim), a row at a time along dimension -2."""

    block_rows = 1

    def rounded(self, rows: int) -> int:
        """The rows a cache of at least `rows` rows holds."""
        return rows

    def zeros(self, leading: tuple[int, ...], rows: int, dim: int, dtype: torch.dtype, device=None) -> torch.Tensor:
        return torch.zeros(*leading, rows, dim, dtype=dtype, device=device)

    def rows(self, keys: torch.Tensor) -> int:
        return keys.shape[-2]

    def read(self, keys: torch.Tensor, count: int) -> torch.Tensor:
        """The first `count` rows, (..., count, dim)."""
        return keys[..., :count, :]

    def write(self, keys: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> None:
        """new (..., n, dim) into rows `rows` (n,)."""
        keys.index_copy_(keys.dim() - 2, rows, new)

    def move(self, keys: torch.Tensor, source: torch.Tensor, destination: torch.Tensor) -> None:
        # The right-hand side is gathered before the write, so overlaps are safe.
        keys[..., destination, :] = keys[..., source, :]

    def copy_rows(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """Every row of `old` into the first rows of the larger `new`."""
        new[..., : old.shape[-2], :] = old


class KeyBlocks:
    """Keys (..., rows / block_rows, dim / 2, block_rows, 2): a row's element pair p at lane
    row % block_rows of its block's vector p."""

    def __init__(self, block_rows: int):
        self.block_rows = block_rows

    def rounded(self, rows: int) -> int:
        return -(-rows // self.block_rows) * self.block_rows

    def zeros(self, leading: tuple[int, ...], rows: int, dim: int, dtype: torch.dtype, device=None) -> torch.Tensor:
        if dim % 2:
            raise ValueError(f"keys in blocks pair their elements; a head of {dim} has an odd count")
        return torch.zeros(*leading, self.rounded(rows) // self.block_rows, dim // 2, self.block_rows, 2, dtype=dtype, device=device)

    def rows(self, keys: torch.Tensor) -> int:
        return keys.shape[-4] * self.block_rows

    def read(self, keys: torch.Tensor, count: int) -> torch.Tensor:
        blocks = -(-count // self.block_rows)
        by_row = _by_row(keys[..., :blocks, :, :, :])
        return by_row.reshape(*keys.shape[:-4], blocks * self.block_rows, -1)[..., :count, :]

    def write(self, keys: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> None:
        _by_row(keys)[..., rows // self.block_rows, rows % self.block_rows, :, :] = new.unflatten(-1, (-1, 2))

    def move(self, keys: torch.Tensor, source: torch.Tensor, destination: torch.Tensor) -> None:
        by_row, size = _by_row(keys), self.block_rows
        # The right-hand side is gathered before the write, so overlaps are safe.
        by_row[..., destination // size, destination % size, :, :] = by_row[..., source // size, source % size, :, :]

    def copy_rows(self, old: torch.Tensor, new: torch.Tensor) -> None:
        new[..., : old.shape[-4], :, :, :] = old


KeyLayout = KeyRows | KeyBlocks


def layout(block_rows: int) -> KeyLayout:
    """Keys in rows (1) or in blocks of `block_rows` rows."""
    return KeyRows() if block_rows == 1 else KeyBlocks(block_rows)


def _by_row(keys: torch.Tensor) -> torch.Tensor:
    """A view (..., blocks, block_rows, dim / 2, 2) of keys in blocks: indexed by (block, lane)
    it gives a row's element pairs."""
    return keys.transpose(-3, -2)
