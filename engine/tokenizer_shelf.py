"""Tokenizers kept from one pair's load to the next.

Pairs often share a model: the demo pair and its n-gram twin, one target with another drafter.
Switching between them read the shared model's tokenizer again, ~0.1 s and 10-22 MB of small
blocks for the demo's two, freed at the old pair's close and allocated again between blocks
that outlived it: over a soak's pair switches those holes kept ~30 MB more resident
(docs/BENCHMARKS.md). The shelf hands back the tokenizer already read while its folder's
files are unchanged, and keeps only what the loaded pair uses, so an idle process holds no
tokenizer it would not hold anyway.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_shelf: dict[tuple, Any] = {}


def tokenizer_for(folder: Path, read: Callable[[Path], Any]) -> Any:
    """The tokenizer in `folder`: the one read before while no file there changed, else
    `read(folder)`'s, kept for the next load."""
    try:
        key = _files_key(folder)
    except OSError:
        return read(folder)  # a folder that cannot be listed: the read says why, as it would have
    with _lock:
        if key in _shelf:
            return _shelf[key]
    tokenizer = read(folder)  # outside the lock: a slow read must not hold up another folder's
    with _lock:
        return _shelf.setdefault(key, tokenizer)


def keep_only(in_use: Iterable[Any]) -> None:
    """Let go of every shelved tokenizer not in `in_use` (the pair just loaded)."""
    kept = {id(tokenizer) for tokenizer in in_use if tokenizer is not None}
    with _lock:
        for key in [key for key, tokenizer in _shelf.items() if id(tokenizer) not in kept]:
            del _shelf[key]


def _files_key(folder: Path) -> tuple:
    """The folder and each file's name, size and modification time: a tokenizer file replaced
    or edited in place (or a model downloaded again) is read again."""
    folder = folder.resolve()
    files = []
    for path in folder.iterdir():
        if path.is_file():
            stat = path.stat()
            files.append((path.name, stat.st_size, stat.st_mtime_ns))
    return (str(folder), tuple(sorted(files)))
