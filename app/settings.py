"""The app's settings: a typed, versioned JSON file under the user config folder.

Model pairs live in the engine's own store (`engine.pairs`), shared with `tandem chat` and
`tandem bench`; this file holds what only the app needs. Every file carries the schema
version it was written with, and `MIGRATIONS` turns an older file into the current shape
one version at a time, so a setting can be renamed or restructured without losing anyone's
choices. Window geometry is not here: Qt's QSettings keeps that.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine import methods
from engine.config import CHAT_DEFAULT_TEMPERATURE, ConfigError, DecodeSettings
from engine.paths import config_dir

SETTINGS_FILE = "app-settings.json"
SCHEMA_VERSION = 2
THEMES = ("system", "light", "dark")
DEFAULT_SERVER_PORT = 8080  # `tandem serve`'s own default


@dataclass
class LocalServerSettings:
    """Settings → Local server: `tandem serve` for the active pair, on 127.0.0.1 (app/local_server.py)."""

    enabled: bool = False
    port: int = DEFAULT_SERVER_PORT
    api_key: str = ""  # empty: no key asked for

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "port": self.port, "api_key": self.api_key}

    @classmethod
    def from_dict(cls, data: Any) -> LocalServerSettings:
        data = data if isinstance(data, dict) else {}
        port = data.get("port")
        port = port if isinstance(port, int) and 1 <= port <= 65535 else DEFAULT_SERVER_PORT
        api_key = data.get("api_key")
        return cls(enabled=data.get("enabled") is True, port=port, api_key=api_key if isinstance(api_key, str) else "")


def _add_local_server(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 adds the local server, off: a file from before it never asked for one."""
    return {**data, "local_server": LocalServerSettings().to_dict()}


# MIGRATIONS[n] turns a version-n dict into a version-(n + 1) dict.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _add_local_server}


@dataclass
class AppSettings:
    active_pair: str = "demo"
    # Trees for a first start with the demo pair; a pair without a draft model falls back
    # to its own default method (see MainWindow.decode_settings). Sampled, so that
    # Regenerate gives another reply; greedy is the toolbar's Greedy toggle.
    decoding: DecodeSettings = field(
        default_factory=lambda: DecodeSettings(method=methods.default_method(methods.NAMES), temperature=CHAT_DEFAULT_TEMPERATURE)
    )
    models: list[str] = field(default_factory=list)  # sources the user added: folders, GGUF files
    show_provenance: bool = False
    # The toolbar's Verifier switch, for every conversation (like Greedy): "exact" replies use
    # `decoding.method`; "sprinter" ones use SPRINTER (approximate) wherever the pair offers it.
    # `decoding.method` is always an exact method, so switching back finds it unchanged.
    verifier_mode: str = methods.EXACT_MODE
    # View → Theme: "system" follows the desktop; "light" and "dark" choose for it. A file
    # without it (written before the menu existed) reads as "system": no migration needed.
    theme: str = "system"
    local_server: LocalServerSettings = field(default_factory=LocalServerSettings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "active_pair": self.active_pair,
            "decoding": self.decoding.to_dict(),
            "models": list(self.models),
            "show_provenance": self.show_provenance,
            "verifier_mode": self.verifier_mode,
            "theme": self.theme,
            "local_server": self.local_server.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AppSettings:
        """Build from a current-version dict; a value that does not fit falls back to its default.
        A saved decoding value (a temperature of 0, say) is kept; a missing one is the app's default."""
        defaults = cls()
        decoding_data = data.get("decoding")
        decoding_data = decoding_data if isinstance(decoding_data, dict) else {}
        known = {f.name for f in fields(DecodeSettings)}
        try:
            decoding = replace(defaults.decoding, **{k: v for k, v in decoding_data.items() if k in known})
        except (ConfigError, TypeError):
            decoding = defaults.decoding
        verifier_mode = data.get("verifier_mode")
        if verifier_mode not in methods.VERIFIER_MODES:
            verifier_mode = defaults.verifier_mode
        if not methods.is_exact(decoding.method):  # an approximate method is the switch's, not the method's
            decoding, verifier_mode = decoding.with_changes(method=defaults.decoding.method), methods.mode_of(decoding.method)
        models = data.get("models", [])
        theme = data.get("theme")
        return cls(
            active_pair=str(data.get("active_pair") or defaults.active_pair),
            decoding=decoding,
            models=[str(m) for m in models] if isinstance(models, list) else [],
            show_provenance=bool(data.get("show_provenance", defaults.show_provenance)),
            verifier_mode=verifier_mode,
            theme=theme if theme in THEMES else defaults.theme,
            local_server=LocalServerSettings.from_dict(data.get("local_server")),
        )


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    version = int(data.get("schema_version", 1))
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
        data["schema_version"] = version
    return data


def load_settings(path: Path | None = None) -> tuple[AppSettings, str | None]:
    """The saved settings, and a warning for the user when the file could not be used
    (it is then kept beside, as `.unreadable` or as the newer version's own copy)."""
    path = path or settings_path()
    if not path.exists():
        return AppSettings(), None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("the file does not hold a settings object")
    except (OSError, ValueError) as error:
        kept = path.with_suffix(".unreadable")
        path.replace(kept)
        return AppSettings(), f"Your settings could not be read ({error}); defaults are in use. The old file is kept as {kept}."
    version = int(data.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        kept = path.with_suffix(f".v{version}.json")
        kept.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
        warning = f"Your settings were written by a newer Tandem; a copy is kept as {kept}."
        return AppSettings.from_dict(data), warning
    return AppSettings.from_dict(migrate(data)), None


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(settings.to_dict(), indent=2), encoding="utf-8")
    temporary.replace(path)  # atomic: a crash never leaves half a file
