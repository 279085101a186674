"""Known model pairs: the built-in demo pair plus the pairs the user saved.

The desktop app's pair picker, `tandem chat --pair NAME` and `tandem bench --pair NAME` all
read the same store, a JSON file in the user config dir.
"""
from __future__ import annotations

import json
from pathlib import Path

from .config import ConfigError, PairConfig, demo_pair
from .paths import config_dir

PAIRS_FILE = "pairs.json"
PAIRS_SCHEMA_VERSION = 1


def builtin_pairs() -> list[PairConfig]:
    return [demo_pair()]


def user_pairs_path() -> Path:
    return config_dir() / PAIRS_FILE


def load_user_pairs() -> list[PairConfig]:
    path = user_pairs_path()
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [PairConfig.from_dict(item) for item in data.get("pairs", [])]
    except (json.JSONDecodeError, AttributeError) as error:
        raise ConfigError(f"The saved model pairs in {path} could not be read: {error}") from error


def save_user_pairs(pairs: list[PairConfig]) -> None:
    builtin_names = {pair.name for pair in builtin_pairs()}
    clashes = [pair.name for pair in pairs if pair.name in builtin_names]
    if clashes:
        raise ConfigError(f"'{clashes[0]}' is the name of a built-in pair; choose another name")
    path = user_pairs_path()
    payload = {"schema_version": PAIRS_SCHEMA_VERSION, "pairs": [pair.to_dict() for pair in pairs]}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    temporary.replace(path)  # atomic: a crash never leaves half a file


def all_pairs() -> list[PairConfig]:
    return builtin_pairs() + load_user_pairs()


def find_pair(name_or_file: str) -> PairConfig:
    """A pair by name, or read from a JSON file describing one pair."""
    candidate = Path(name_or_file)
    if candidate.suffix == ".json" and candidate.is_file():
        try:
            return PairConfig.from_dict(json.loads(candidate.read_text(encoding="utf-8")))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{candidate} is not valid JSON: {error}") from error
    pairs = all_pairs()
    for pair in pairs:
        if pair.name == name_or_file:
            return pair
    known = ", ".join(pair.name for pair in pairs)
    raise ConfigError(f"unknown pair {name_or_file!r}; known pairs: {known}")
