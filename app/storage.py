"""Conversations in SQLite under the user data folder.

Every write commits on its own (autocommit, WAL journal), and a streaming reply is written
with each delta, so killing the app mid-reply keeps exactly what was on screen. Replies
still marked "streaming" when the store is opened again were cut off, and become
"interrupted". A file written by an older version is brought up to date in place, one
`MIGRATIONS` step at a time, in one transaction.

A chats file that cannot be used (not a database, or written by a newer schema) is renamed
beside itself, never deleted, and a fresh store starts; the user is told where the old one is.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from engine.paths import data_dir

from .provenance import Runs

DATABASE_FILE = "chats.sqlite3"
SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    provenance TEXT NOT NULL DEFAULT '[]',
    figures TEXT,
    status TEXT NOT NULL DEFAULT 'complete',
    note TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    verifier TEXT NOT NULL DEFAULT 'exact'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS app_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Message statuses. Only "streaming" is ever rewritten by someone other than its stream.
COMPLETE, STREAMING, STOPPED, INTERRUPTED, FAILED = "complete", "streaming", "stopped", "interrupted", "error"
# Which verifier wrote a reply: "exact" (the target checked every token) or an approximate
# one ("sprinter"). Kept from the reply's first row, so that a reply cut short still says it.
EXACT = "exact"

# MIGRATIONS[n] turns a version-n database into a version-(n + 1) one, in place.
MIGRATIONS = {
    1: "ALTER TABLE messages ADD COLUMN verifier TEXT NOT NULL DEFAULT 'exact'",
}


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    updated_at: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str  # "user" | "assistant"
    content: str
    provenance: Runs
    figures: dict | None  # the final speed figures of a reply (see app/figures.py)
    status: str
    note: str  # why a reply ended early, or what went wrong
    verifier: str = EXACT  # "exact", or the approximate verifier that wrote the reply

    @property
    def approximate(self) -> bool:
        return self.verifier != EXACT


class NewerSchemaError(Exception):
    """The chats file was written by a newer Tandem, whose tables this one may not understand."""


class ChatStore:
    def __init__(self, path: Path):
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)
        try:
            self._prepare()
        except BaseException:
            self._db.close()  # so that the caller can move the file aside
            raise

    def _prepare(self) -> None:
        self._db.row_factory = sqlite3.Row
        version = self._db.execute("PRAGMA user_version").fetchone()[0]  # "not a database" fails here
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(f"chat schema {version}; this version reads {SCHEMA_VERSION}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        if 0 < version < SCHEMA_VERSION:  # a file from an older version: bring it up to date
            self._db.execute("BEGIN")
            for step in range(version, SCHEMA_VERSION):
                self._db.execute(MIGRATIONS[step])
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")  # in the same transaction
            self._db.execute("COMMIT")
        self._db.executescript(SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._db.execute(
            "UPDATE messages SET status=?, note=? WHERE status=?",
            (INTERRUPTED, "The app closed before this reply finished.", STREAMING),
        )

    def close(self) -> None:
        self._db.close()

    # Conversations

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; with `search`, only those whose title or messages contain it."""
        if not search.strip():
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC")
        else:
            pattern = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._db.execute(
                """SELECT * FROM conversations c
                   WHERE c.title LIKE :p ESCAPE '\\'
                      OR EXISTS (SELECT 1 FROM messages m
                                 WHERE m.conversation_id = c.id AND m.content LIKE :p ESCAPE '\\')
                   ORDER BY c.updated_at DESC, c.id DESC""",
                {"p": pattern},
            )
        return [_conversation(row) for row in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        return _conversation(row) if row else None

    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO conversations (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        return Conversation(cursor.lastrowid, title, system_prompt, now)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._db.execute("UPDATE conversations SET system_prompt=? WHERE id=?", (system_prompt, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # Messages

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id", (conversation_id,))
        return [_message(row) for row in rows]

    def message(self, message_id: int) -> StoredMessage | None:
        row = self._db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        return _message(row) if row else None

    def add_message(
        self, conversation_id: int, role: str, content: str, status: str = COMPLETE, verifier: str = EXACT
    ) -> StoredMessage:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, status, created_at, verifier) VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, role, content, status, now, verifier),
        )
        self._touch(conversation_id, now)
        return StoredMessage(cursor.lastrowid, conversation_id, role, content, [], None, status, "", verifier)

    def update_reply(self, message_id: int, content: str, provenance: Runs) -> None:
        """Save what has streamed so far; called with every delta."""
        self._db.execute(
            "UPDATE messages SET content=?, provenance=? WHERE id=?",
            (content, json.dumps(provenance), message_id),
        )

    def reopen_reply(self, message_id: int, verifier: str) -> None:
        """A finished reply is being carried on (Continue): it streams again, and is marked
        approximate if the rest is written by an approximate verifier."""
        self._db.execute(
            "UPDATE messages SET status=?, verifier=CASE WHEN verifier=? THEN ? ELSE verifier END WHERE id=?",
            (STREAMING, EXACT, verifier, message_id),
        )

    def set_verifier(self, message_id: int, verifier: str) -> None:
        """Put back the verifier of a reply whose continue wrote nothing."""
        self._db.execute("UPDATE messages SET verifier=? WHERE id=?", (verifier, message_id))

    def finish_reply(
        self, message_id: int, content: str, provenance: Runs, figures: dict | None, status: str, note: str = ""
    ) -> None:
        self._db.execute(
            "UPDATE messages SET content=?, provenance=?, figures=?, status=?, note=? WHERE id=?",
            (content, json.dumps(provenance), json.dumps(figures) if figures else None, status, note, message_id),
        )

    def delete_messages_from(self, message: StoredMessage) -> None:
        """Delete `message` and every later one of its conversation (regenerate, edit)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation_id=? AND id>=?", (message.conversation_id, message.id)
        )

    def _touch(self, conversation_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (now, conversation_id))

    # Small pieces of app state that belong with the chats (which conversation was open)

    def state(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM app_state WHERE key=?", (key,)).fetchone()
        return row["value"] if row else None

    def set_state(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO app_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )


def open_chat_store(path: Path | None = None) -> tuple[ChatStore, str | None]:
    """The chat store, and a message for the user when the old file had to be set aside."""
    path = path or data_dir() / DATABASE_FILE
    try:
        return ChatStore(path), None
    except NewerSchemaError as error:
        kept = _set_aside(path)
        why = f"Your chats were saved by a newer version of Tandem ({error})."
    except sqlite3.DatabaseError as error:
        kept = _set_aside(path)
        why = f"Your chats file could not be opened ({error})."
    return ChatStore(path), f"{why} It is kept as {kept}; new chats go to a fresh file."


def _set_aside(path: Path) -> Path:
    """Rename `path` (and SQLite's journal files beside it) to a free timestamped name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = path.with_name(f"{path.stem}-set-aside-{stamp}{path.suffix}")
    number = 1
    while kept.exists():
        number += 1
        kept = path.with_name(f"{path.stem}-set-aside-{stamp}-{number}{path.suffix}")
    path.replace(kept)
    for journal in ("-wal", "-shm"):
        companion = path.with_name(path.name + journal)
        if companion.exists():
            companion.replace(kept.with_name(kept.name + journal))
    return kept


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], row["title"], row["system_prompt"], row["updated_at"])


def _message(row: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        role=row["role"],
        content=row["content"],
        provenance=[(kind, count) for kind, count in json.loads(row["provenance"])],
        figures=json.loads(row["figures"]) if row["figures"] else None,
        status=row["status"],
        note=row["note"],
        verifier=row["verifier"],
    )
