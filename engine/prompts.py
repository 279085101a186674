"""The shipped prompt sets and the one reader of prompt files.

Three sets ship in resources/prompts/: `distill_prompts.jsonl`, which the target answers to
train drafts and heads (`tandem distill`, `calibrate`, `ngram-table`), and two that `tandem
bench` measures on and no training ever reads, so that acceptance is measured on prompts no
draft was tuned on: `chat_prompts.jsonl`, and `task_kinds.jsonl`, four prompts of each of six
kinds of task (chat, translation, summarizing a given text, answering from a given text, math,
code), each line with its "kind", over which the bench reports each method by kind.
"""
from __future__ import annotations

import json
from pathlib import Path

from .config import ConfigError

PROMPTS_FOLDER = Path(__file__).resolve().parent.parent / "resources" / "prompts"
CHAT_PROMPTS = PROMPTS_FOLDER / "chat_prompts.jsonl"
DISTILL_PROMPTS = PROMPTS_FOLDER / "distill_prompts.jsonl"
TASK_KIND_PROMPTS = PROMPTS_FOLDER / "task_kinds.jsonl"


# The shipped sets a command's --prompts takes by name
NAMED_SETS = {"chat": CHAT_PROMPTS, "task-kinds": TASK_KIND_PROMPTS}


def prompts_file(given: Path | None, default: Path = CHAT_PROMPTS) -> Path:
    """The file `--prompts` names: a shipped set's name (where no such file is here), a path,
    or `default` when none was given."""
    if given is None:
        return default
    return NAMED_SETS[str(given)] if str(given) in NAMED_SETS and not given.exists() else given


def read_prompts(path: Path) -> list[str]:
    """The "prompt" of every line of a JSON Lines file; a clear error for a bad file."""
    return [prompt for prompt, _ in read_prompts_and_kinds(path)]


def read_prompts_and_kinds(path: Path) -> list[tuple[str, str]]:
    """The "prompt" and "kind" of every line ("" where a line names no kind); a clear error
    for a bad file."""
    prompts = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read prompts file {path}: {error.strerror}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            prompts.append((str(entry["prompt"]), str(entry.get("kind", ""))))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(f"{path}:{number}: expected a JSON object with a \"prompt\" key") from error
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts
