"""The chat store: conversations, streamed replies, search, and what survives a restart."""
from __future__ import annotations

import sqlite3

from app.storage import COMPLETE, INTERRUPTED, STREAMING, ChatStore, open_chat_store


def test_conversations_can_be_created_renamed_searched_and_deleted(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    first = store.create_conversation("Paris trip")
    second = store.create_conversation("Recipes")
    store.add_message(second.id, "user", "How long do I boil an egg?")
    store.rename_conversation(first.id, "France trip")

    assert [c.title for c in store.list_conversations()] == ["Recipes", "France trip"]
    assert [c.id for c in store.list_conversations("egg")] == [second.id]
    assert [c.id for c in store.list_conversations("FRANCE")] == [first.id]
    assert store.list_conversations("100%") == []  # LIKE wildcards are searched literally

    store.delete_conversation(second.id)
    assert [c.id for c in store.list_conversations()] == [first.id]
    assert store.messages(second.id) == []


def test_a_reply_saved_while_streaming_is_marked_interrupted_on_the_next_start(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    conversation = store.create_conversation("Chat")
    store.add_message(conversation.id, "user", "Hi")
    reply = store.add_message(conversation.id, "assistant", "", STREAMING)
    store.update_reply(reply.id, "Hello th", [("draft", 5), ("target", 3)])

    # Another connection sees it at once: nothing waits for a commit at the end of the reply.
    row = sqlite3.connect(path).execute("SELECT content, status FROM messages WHERE id=?", (reply.id,)).fetchone()
    assert row == ("Hello th", STREAMING)

    reopened = ChatStore(path)
    saved = reopened.messages(conversation.id)[-1]
    assert (saved.content, saved.status, saved.provenance) == ("Hello th", INTERRUPTED, [("draft", 5), ("target", 3)])


def test_finishing_a_reply_keeps_its_figures_and_regenerating_drops_later_messages(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    conversation = store.create_conversation("Chat")
    question = store.add_message(conversation.id, "user", "Hi")
    reply = store.add_message(conversation.id, "assistant", "", STREAMING)
    store.finish_reply(reply.id, "Hello", [("target", 5)], {"stats": {"tokens_per_s": 12.5}}, COMPLETE)
    assert store.message(reply.id).figures == {"stats": {"tokens_per_s": 12.5}}

    store.delete_messages_from(question)
    assert store.messages(conversation.id) == []


def test_app_state_round_trips(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    store.set_state("selected_conversation", "3")
    store.set_state("selected_conversation", "4")
    assert ChatStore(tmp_path / "chats.sqlite3").state("selected_conversation") == "4"


def test_a_file_that_is_not_a_database_is_kept_aside_and_a_fresh_store_starts(tmp_path):
    path = tmp_path / "chats.sqlite3"
    garbage = bytes(range(256)) * 64
    path.write_bytes(garbage)

    store, warning = open_chat_store(path)

    assert store.list_conversations() == []
    store.create_conversation("New")  # the fresh store works
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("chats-set-aside-")]
    assert len(kept) == 1 and kept[0].read_bytes() == garbage  # renamed, never deleted
    assert str(kept[0]) in warning and "not a database" in warning


def test_chats_from_a_newer_schema_are_kept_aside_untouched(tmp_path):
    path = tmp_path / "chats.sqlite3"
    newer = sqlite3.connect(path)
    newer.execute("CREATE TABLE conversations (id INTEGER PRIMARY KEY, shape TEXT)")
    newer.execute("PRAGMA user_version=7")
    newer.commit()
    newer.close()

    store, warning = open_chat_store(path)

    assert store.list_conversations() == []
    kept = next(p for p in tmp_path.iterdir() if p.name.startswith("chats-set-aside-"))
    assert sqlite3.connect(kept).execute("PRAGMA user_version").fetchone() == (7,)
    assert "newer version of Tandem" in warning and str(kept) in warning


def test_a_healthy_store_opens_without_a_warning(tmp_path):
    ChatStore(tmp_path / "chats.sqlite3").create_conversation("Kept")
    store, warning = open_chat_store(tmp_path / "chats.sqlite3")
    assert warning is None
    assert [c.title for c in store.list_conversations()] == ["Kept"]


def test_a_reply_keeps_the_verifier_that_wrote_it_even_when_cut_short(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    conversation = store.create_conversation("Chat")
    question = store.add_message(conversation.id, "user", "Hi")
    reply = store.add_message(conversation.id, "assistant", "", STREAMING, verifier="sprinter")
    store.update_reply(reply.id, "Hel", [("unchecked", 3)])
    assert reply.approximate and not question.approximate

    saved = ChatStore(path).messages(conversation.id)  # as after a crash mid-reply
    assert [(m.verifier, m.approximate) for m in saved] == [("exact", False), ("sprinter", True)]
    assert saved[-1].status == INTERRUPTED and saved[-1].provenance == [("unchecked", 3)]


def test_chats_saved_before_the_verifier_column_open_with_every_reply_exact(tmp_path):
    path = tmp_path / "chats.sqlite3"
    older = sqlite3.connect(path)  # the version-1 tables, as the previous release wrote them
    older.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL, content TEXT NOT NULL, provenance TEXT NOT NULL DEFAULT '[]', figures TEXT,
            status TEXT NOT NULL DEFAULT 'complete', note TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL);
        CREATE TABLE app_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO conversations VALUES (1, 'Old chat', '', 0, 0);
        INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'user', 'Hi', 0), (1, 'assistant', 'Hello', 0);
        PRAGMA user_version=1;
    """)
    older.close()

    store, warning = open_chat_store(path)

    assert warning is None  # migrated in place, nothing set aside
    assert [(m.content, m.verifier) for m in store.messages(1)] == [("Hi", "exact"), ("Hello", "exact")]
    reply = store.add_message(1, "assistant", "", STREAMING, verifier="sprinter")
    assert store.message(reply.id).approximate
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (2,)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("chats-set-aside-")]
