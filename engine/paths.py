"""Where Tandem keeps its files: the platform's user folders, or one base folder.

Setting `TANDEM_HOME` puts cache, data and config under that one folder, which is how tests
(and anyone who wants a portable install) keep Tandem away from the real user folders.
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "tandem"
HOME_VARIABLE = "TANDEM_HOME"


def cache_dir() -> Path:
    """Rebuildable files: converted model weights, calibrations."""
    return _ensure(locations()["cache"])


def data_dir() -> Path:
    """Files the user would miss: saved chats."""
    return _ensure(locations()["data"])


def config_dir() -> Path:
    """Settings."""
    return _ensure(locations()["config"])


def locations() -> dict[str, Path]:
    """Where each kind of file goes, without creating any folder (`tandem --paths` shows them)."""
    return {
        "config": _base("config") or Path(platformdirs.user_config_dir(APP_NAME)),
        "data": _base("data") or Path(platformdirs.user_data_dir(APP_NAME)),
        "cache": _base("cache") or Path(platformdirs.user_cache_dir(APP_NAME)),
    }


def _base(kind: str) -> Path | None:
    home = os.environ.get(HOME_VARIABLE)
    return Path(home).expanduser() / kind if home else None


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
