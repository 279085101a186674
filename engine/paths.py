"""Where Tandem keeps its files: the platform's user folders, or one base folder.

Setting `TANDEM_HOME` puts cache, data and config under that one folder, which is how tests
(and anyone who wants a portable install) keep Tandem away from the real user folders.
"""
from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
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


def keep_compiled_kernels() -> None:
    """Point torch.compile's kernel cache (inductor's TORCHINDUCTOR_CACHE_DIR) into Tandem's
    cache, one folder per torch version, unless the user chose a folder. Called first thing
    in a process: inductor fixes its folder the first time anything asks for it, and a
    compile in a temporary folder is lost at the next reboot."""
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        return
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(locations()["cache"] / "compiled" / f"torch-{torch_version}"))


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
