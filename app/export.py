"""File → Export: a conversation as Markdown (to read) or JSON (to keep, or to load elsewhere).

The Markdown has the title, the system prompt, and each turn under its role, with a reply's
figures line (speed, method) and how it ended when those were stored. The JSON is the stored
conversation as it is: every field of the conversation and of each message, provenance
runs and figures included.

Nothing here changes the chats: an export only reads the store. A file is written beside
its final name and then moved there, so an existing file is either replaced whole or left as
it was; "export all" writes into a new folder of its own, so it never replaces anything.
"""
from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import asdict
from pathlib import Path

from . import figures as fmt
from .markdown_blocks import with_fences_closed
from .storage import COMPLETE, ChatStore, Conversation, StoredMessage

FORMAT = "tandem-chat"
FORMAT_VERSION = 1
MARKDOWN, JSON = "md", "json"
ROLE_TITLES = {"user": "You", "assistant": "Tandem", "system": "System"}
STATUS_WORDS = {"stopped": "Stopped", "interrupted": "Interrupted", "error": "Ended with an error"}
FILE_NAME_CHARS = 60


class ExportError(Exception):
    """A file could not be written; the message says which and why, for the user."""


def as_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt.strip():
        lines += ["**System prompt:**", "", _quoted(conversation.system_prompt), ""]
    for message in messages:
        lines += [f"## {ROLE_TITLES.get(message.role, message.role)}", ""]
        if message.approximate:
            lines += [f"*Approximate: written by {fmt.method_title(message.verifier)}.*", ""]
        # a stopped reply may end inside a code block: closed, or its ending and figures read as code
        lines += [with_fences_closed(message.content.rstrip()) or "*(empty)*", ""]
        if message.status != COMPLETE:
            ended = STATUS_WORDS.get(message.status, message.status)
            lines += [f"*{ended}{': ' + message.note if message.note else '.'}*", ""]
        if message.figures:
            lines += [f"*{fmt.compact_line(message.figures)} · {fmt.ended(message.figures)}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def as_json(conversation: Conversation, messages: list[StoredMessage]) -> str:
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "conversation": asdict(conversation),
        "messages": [asdict(message) for message in messages],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def render(conversation: Conversation, messages: list[StoredMessage], kind: str) -> str:
    return as_json(conversation, messages) if kind == JSON else as_markdown(conversation, messages)


def kind_of(path: Path) -> str:
    """JSON for a .json file, Markdown for anything else."""
    return JSON if path.suffix.lower() == ".json" else MARKDOWN


def export_conversation(store: ChatStore, conversation_id: int, path: Path) -> Path:
    """Write one conversation to `path`, in the format its suffix names."""
    conversation = store.conversation(conversation_id)
    if conversation is None:
        raise ExportError("That conversation no longer exists.")
    write_text(path, render(conversation, store.messages(conversation_id), kind_of(path)))
    return path


def export_all(store: ChatStore, folder: Path) -> tuple[Path, int]:
    """Every conversation as Markdown and JSON, in a new folder inside `folder`; returns that
    folder and how many conversations it holds."""
    target = _new_folder(folder)
    conversations = store.list_conversations()
    for number, conversation in enumerate(reversed(conversations), start=1):  # oldest first
        messages = store.messages(conversation.id)
        stem = f"{number:03d}-{file_name(conversation.title)}"
        for kind in (MARKDOWN, JSON):
            write_text(target / f"{stem}.{kind}", render(conversation, messages, kind))
    return target, len(conversations)


def file_name(title: str) -> str:
    """A title as a file name every system accepts."""
    cleaned = re.sub(r"[\s-]+", "-", re.sub(r"[^\w\- ]+", "", title).strip())
    return cleaned[:FILE_NAME_CHARS].rstrip("-") or "chat"


def write_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.part")
    try:
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):  # the folder itself may be what cannot be written
            temporary.unlink(missing_ok=True)
        raise ExportError(f"Could not write {path}: {_reason(error)}.") from error


def _new_folder(parent: Path) -> Path:
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    folder, number = parent / f"tandem-chats-{stamp}", 1
    while folder.exists():
        number += 1
        folder = parent / f"tandem-chats-{stamp}-{number}"
    try:
        folder.mkdir(parents=True)
    except OSError as error:
        raise ExportError(f"Could not create a folder in {parent}: {_reason(error)}.") from error
    return folder


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.strip().splitlines())
