"""Where other apps keep their models on this machine.

Each app has its own layout, read by its own finder in `scan.py`:

- LM Studio: `~/.lmstudio/models` (older versions `~/.cache/lm-studio/models`), as
  publisher/repo/file.gguf;
- Ollama: `~/.ollama/models` (or `$OLLAMA_MODELS`): manifests naming content-addressed blobs;
- the Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
  `~/.cache/huggingface/hub`, as models--ORG--NAME/snapshots/<revision>/;
- GPT4All: one folder of .gguf files, per platform;
- Jan: `~/jan/models` (before 0.5) or its data folder's `models`, per platform.

`TANDEM_SEARCH_HOME` stands in for the whole machine: the home folder the paths start from,
with the environment's HF_HOME, HF_HUB_CACHE and OLLAMA_MODELS not read. Tests point it at a
temporary folder laid out as each app lays it out.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SEARCH_HOME_VARIABLE = "TANDEM_SEARCH_HOME"

LM_STUDIO, OLLAMA, HUGGING_FACE, GPT4ALL, JAN, USER_FOLDER = (
    "LM Studio", "Ollama", "Hugging Face cache", "GPT4All", "Jan", "your folder",
)


@dataclass(frozen=True)
class ModelRoot:
    app: str  # one of the names above
    folder: Path


def model_roots(home: Path | None = None, environ: Mapping[str, str] | None = None) -> list[ModelRoot]:
    """The folders to search, existing or not (the finders skip those that are not there)."""
    if home is None:
        override = os.environ.get(SEARCH_HOME_VARIABLE)
        home = Path(override).expanduser() if override else Path.home()
        if environ is None and override:
            environ = {}
    environ = os.environ if environ is None else environ
    return [
        *(ModelRoot(LM_STUDIO, home / path) for path in (".lmstudio/models", ".cache/lm-studio/models")),
        ModelRoot(OLLAMA, Path(environ["OLLAMA_MODELS"]) if environ.get("OLLAMA_MODELS") else home / ".ollama/models"),
        ModelRoot(HUGGING_FACE, hub_cache(home, environ)),
        *(ModelRoot(GPT4ALL, home / path) for path in (
            ".local/share/nomic.ai/GPT4All", "Library/Application Support/nomic.ai/GPT4All", "AppData/Local/nomic.ai/GPT4All",
        )),
        *(ModelRoot(JAN, home / path) for path in (
            "jan/models", ".local/share/Jan/data/models", "Library/Application Support/Jan/data/models",
            "AppData/Roaming/Jan/data/models",
        )),
    ]


def hub_cache(home: Path, environ: Mapping[str, str]) -> Path:
    """The hub cache as huggingface_hub finds it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else home / ".cache"
    return cache / "huggingface" / "hub"
