"""The folders the user asked Tandem to search for models, beside the saved pairs in the user
config dir, so the app's pair picker and the console commands search the same ones."""
from __future__ import annotations

import json
from pathlib import Path

from ..paths import config_dir

FOLDERS_FILE = "model-folders.json"
FOLDERS_SCHEMA_VERSION = 1


def folders_path() -> Path:
    return config_dir() / FOLDERS_FILE


def search_folders() -> list[str]:
    """The folders added, in the order added; [] when none were, or the file cannot be read
    (it only lists places to look: losing it costs a click, not a choice)."""
    try:
        folders = json.loads(folders_path().read_text(encoding="utf-8")).get("folders", [])
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return []
    return [str(folder) for folder in folders if isinstance(folder, str)]


def add_search_folder(folder: str | Path) -> list[str]:
    """Remember `folder` (once); return every folder now searched."""
    folders = search_folders()
    folder = str(Path(folder).expanduser())
    if folder not in folders:
        folders.append(folder)
        path = folders_path()
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"schema_version": FOLDERS_SCHEMA_VERSION, "folders": folders}, indent=2), encoding="utf-8")
        temporary.replace(path)  # atomic: a crash never leaves half a file
    return folders
