"""The shipped prompt sets and the one reader of prompt files.

Two sets ship in resources/prompts/: `distill_prompts.jsonl`, which the target answers to
train drafts and heads (`tandem distill`, `calibrate`, `ngram-table`), and
`chat_prompts.jsonl`, which `tandem bench` measures on and no training ever reads, so that
acceptance is measured on prompts no draft was tuned on.
"""
from __future__ import annotations

import json
from pathlib import Path

from .config import ConfigError

PROMPTS_FOLDER = Path(__file__).resolve().parent.parent / "resources" / "prompts"
CHAT_PROMPTS = PROMPTS_FOLDER / "chat_prompts.jsonl"
DISTILL_PROMPTS = PROMPTS_FOLDER / "distill_prompts.jsonl"


def read_prompts(path: Path) -> list[str]:
    """The "prompt" of every line of a JSON Lines file; a clear error for a bad file."""
    prompts = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read prompts file {path}: {error.strerror}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompts.append(str(json.loads(line)["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ConfigError(f"{path}:{number}: expected a JSON object with a \"prompt\" key") from error
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts
