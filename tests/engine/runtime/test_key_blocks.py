"""Keys in blocks of rows (key_blocks.py) against keys in rows: the same writes, moves, growth and
reads give the same rows, whatever the block size and however the rows fall across blocks."""
from __future__ import annotations

import random

import pytest
import torch

from engine.runtime.key_blocks import KeyBlocks, KeyRows, layout

HEADS, DIM = 3, 10


@pytest.mark.parametrize("block_rows", [2, 16])
@pytest.mark.parametrize("seed", range(3))
def test_keys_in_blocks_are_the_keys_in_rows_through_writes_moves_and_growth(block_rows, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows, blocks = KeyRows(), KeyBlocks(block_rows)
    capacity = rng.randrange(20, 40)  # rarely whole blocks: the last one is partly past the rows
    by_rows = rows.zeros((1, HEADS), capacity, DIM, torch.float32)
    in_blocks = blocks.zeros((1, HEADS), capacity, DIM, torch.float32)
    assert blocks.rows(in_blocks) == blocks.rounded(capacity) >= capacity > blocks.rounded(capacity) - block_rows
    for _ in range(6):
        written = torch.tensor(rng.sample(range(capacity), rng.randrange(1, 8)))
        new = torch.randn(1, HEADS, len(written), DIM)
        rows.write(by_rows, written, new)
        blocks.write(in_blocks, written, new)
        # a kept path: rows moved down onto others, source and destination overlapping
        source = torch.tensor(sorted(rng.sample(range(capacity), 5)))
        destination = source - rng.randrange(0, int(source[0]) + 1)
        rows.move(by_rows, source, destination)
        blocks.move(in_blocks, source, destination)
        count = rng.randrange(1, capacity + 1)
        assert torch.equal(blocks.read(in_blocks, count), rows.read(by_rows, count))
    grown_rows = rows.zeros((1, HEADS), capacity + 9, DIM, torch.float32)
    grown_blocks = blocks.zeros((1, HEADS), capacity + 9, DIM, torch.float32)
    rows.copy_rows(by_rows, grown_rows)
    blocks.copy_rows(in_blocks, grown_blocks)
    assert torch.equal(blocks.read(grown_blocks, capacity + 9), rows.read(grown_rows, capacity + 9))


def test_a_block_holds_each_rows_element_pairs_side_by_side():
    """The layout the C scores read (simd.h, KEY_BLOCK_ROWS): row r's pair p at lane r % 16 of
    its block's vector p."""
    keys = KeyBlocks(16).zeros((), 32, 4, torch.float32)
    KeyBlocks(16).write(keys, torch.tensor([17]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert keys.shape == (2, 2, 16, 2)
    assert keys[1, 0, 1].tolist() == [1.0, 2.0] and keys[1, 1, 1].tolist() == [3.0, 4.0]
    assert int((keys != 0).sum()) == 4


def test_keys_in_rows_stay_as_torch_keeps_them_and_blocks_refuse_an_odd_head():
    assert isinstance(layout(1), KeyRows) and isinstance(layout(16), KeyBlocks)
    assert KeyRows().zeros((1, 2), 5, 8, torch.float32).shape == (1, 2, 5, 8)
    with pytest.raises(ValueError, match="odd"):
        KeyBlocks(16).zeros((1, 2), 5, 7, torch.float32)
