"""A throwaway TANDEM_HOME for the screenshot and responsiveness scripts.

Chats and settings go to a fresh folder; converted model weights are rebuildable, so the
user cache is shared and the demo GGUF is converted only once per machine.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs


def use_scratch_home(prefix: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["TANDEM_HOME"] = str(home)
    cache = Path(platformdirs.user_cache_dir("tandem"))
    cache.mkdir(parents=True, exist_ok=True)
    (home / "cache").symlink_to(cache, target_is_directory=True)
    return home
