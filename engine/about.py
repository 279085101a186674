"""`tandem --version` and `tandem --paths`: what is installed and where Tandem keeps its files.

Both answer in well under a second, so nothing here imports torch, transformers or Qt: the
versions of those come from package metadata, which is read without importing the package.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from . import __version__
from .paths import HOME_VARIABLE, locations

# The distributions whose versions decide how Tandem behaves, as pip names them.
COMPONENTS = ("llama-cpp-python", "torch", "transformers", "PySide6")
# What each folder of `paths.locations()` holds.
CONTENTS = {
    "config": "settings, saved model pairs, window layout",
    "data": "chats, calibrated heads",
    "cache": "converted and re-quantised models, tokenizers; safe to delete",
}


def version_report() -> str:
    lines = [f"tandem {__version__}", f"Python {platform.python_version()}"]
    for name, version in component_versions().items():
        lines.append(f"{name} {version or 'not installed'}")
    if getattr(sys, "frozen", False):
        lines.append(f"desktop bundle: {os.path.dirname(sys.executable)}")
    return "\n".join(lines)


def component_versions() -> dict[str, str | None]:
    """Each of COMPONENTS and its installed version (None: not installed); the app's About
    dialog shows the same."""
    return {name: installed_version(name) for name in COMPONENTS}


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def paths_report() -> str:
    """One line per kind of file, `kind: folder  (what it holds)`; the folders may not exist yet."""
    home = os.environ.get(HOME_VARIABLE)
    lines = [f"{kind}: {folder}  ({CONTENTS[kind]})" for kind, folder in locations().items()]
    if home:
        lines.append(f"({HOME_VARIABLE} is set, so all three are under {home})")
    return "\n".join(lines)
