"""File → Export: one chat or all of them, as Markdown and JSON, refused clearly where the
file cannot be written, never changing the chats."""
from __future__ import annotations

import json
import os

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.export import ExportError, as_markdown, export_all, export_conversation
from app.markdown_blocks import split_blocks
from app.storage import STOPPED, open_chat_store
from tests.app.helpers import send_and_wait

FIGURES = {
    "stats": {"tokens_generated": 12, "tokens_per_s": 24.0, "time_to_first_token_s": 0.31, "acceptance_rate": 0.5,
              "mean_accepted_per_target_call": 2.0},
    "decoding": {"method": "chain", "draft_tokens": 4, "temperature": 0, "max_new_tokens": 12},
    "stop_reason": "length",
}


@pytest.fixture
def store():
    store, _warning = open_chat_store()
    yield store
    store.close()


def owls(store):
    conversation = store.create_conversation("Owls at night", "Answer briefly.")
    store.add_message(conversation.id, "user", "Why do owls hunt at night?")
    reply = store.add_message(conversation.id, "assistant", "")
    store.finish_reply(reply.id, "Because mice are out.\n\n```python\nprint('hoot')\n```", [("draft", 3), ("target", 5)], FIGURES, "complete")
    store.add_message(conversation.id, "user", "And by day?")
    cut = store.add_message(conversation.id, "assistant", "")
    store.finish_reply(cut.id, "They sle", [], None, STOPPED, "")
    return conversation


def test_markdown_has_the_title_the_system_prompt_each_turn_and_the_figures_line(store):
    conversation = owls(store)
    text = as_markdown(store.conversation(conversation.id), store.messages(conversation.id))
    assert text.startswith("# Owls at night\n")
    assert "> Answer briefly." in text
    assert text.count("## You") == 2 and text.count("## Tandem") == 2
    assert "```python\nprint('hoot')\n```" in text
    assert "24.0 tok/s" in text and "chain, K=4, greedy" in text and "reached the 12-token limit" in text
    assert "*Stopped.*" in text
    assert text.index("Why do owls") < text.index("Because mice") < text.index("And by day") < text.index("They sle")


def test_a_reply_stopped_inside_a_code_block_is_closed_before_its_ending_and_figures(store):
    conversation = store.create_conversation("Loops")
    store.add_message(conversation.id, "user", "Write a loop")
    cut = store.add_message(conversation.id, "assistant", "")
    store.finish_reply(cut.id, "Here:\n\n```python\nfor i in range(3):\n    print(i", [], FIGURES, STOPPED, "")
    text = as_markdown(store.conversation(conversation.id), store.messages(conversation.id))
    # every fence line opens or closes a block: an even count, the last one before the ending
    fences = [line for line in text.splitlines() if line.startswith("```")]
    assert fences == ["```python", "```"]
    assert text.index("    print(i\n```\n") < text.index("*Stopped.*") < text.index("24.0 tok/s")
    assert split_blocks(text)[-1].kind == "prose"  # the figures line reads as text, not code


def test_json_is_the_stored_conversation_field_for_field(store, tmp_path):
    conversation = owls(store)
    path = export_conversation(store, conversation.id, tmp_path / "owls.json")
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["format"] == "tandem-chat"
    assert document["conversation"]["title"] == "Owls at night"
    assert document["conversation"]["system_prompt"] == "Answer briefly."
    stored = store.messages(conversation.id)
    assert [m["id"] for m in document["messages"]] == [m.id for m in stored]
    reply = document["messages"][1]
    assert reply["content"] == stored[1].content and reply["figures"] == FIGURES
    assert [tuple(run) for run in reply["provenance"]] == [("draft", 3), ("target", 5)]
    assert document["messages"][3]["status"] == STOPPED and document["messages"][3]["verifier"] == "exact"


def test_all_chats_go_to_a_new_folder_in_both_formats_and_replace_nothing(store, tmp_path):
    owls(store)
    cats = store.create_conversation("Cats / dogs?")
    store.add_message(cats.id, "user", "Cats or dogs?")
    (tmp_path / "keep.md").write_text("mine")
    folder, count = export_all(store, tmp_path)
    assert count == 2 and folder.parent == tmp_path
    assert sorted(p.name for p in folder.iterdir()) == [
        "001-Owls-at-night.json", "001-Owls-at-night.md", "002-Cats-dogs.json", "002-Cats-dogs.md",
    ]
    assert (tmp_path / "keep.md").read_text() == "mine"
    again, _count = export_all(store, tmp_path)
    assert again != folder


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_place_is_refused_with_the_path_and_the_reason(store, tmp_path):
    conversation = owls(store)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ExportError, match=r"Could not write .*locked/owls.md: permission denied"):
            export_conversation(store, conversation.id, locked / "owls.md")
        with pytest.raises(ExportError, match="permission denied"):
            export_all(store, locked)
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == []
    assert len(store.messages(conversation.id)) == 4  # nothing lost


def test_a_path_inside_a_file_is_refused_and_the_file_is_kept(store, tmp_path):
    conversation = owls(store)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"Could not write .*notes.txt/owls.md: not a directory"):
        export_conversation(store, conversation.id, tmp_path / "notes.txt" / "owls.md")
    with pytest.raises(ExportError, match=r"Could not create a folder in .*notes.txt: not a directory"):
        export_all(store, tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine" and len(store.messages(conversation.id)) == 4


def test_file_export_chat_writes_what_the_dialog_chose(ready_window, qtbot, monkeypatch, tmp_path):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    chosen = tmp_path / "owls.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(chosen), "Markdown (*.md)"))
    window.export_chat_action.trigger()
    assert chosen.read_text(encoding="utf-8").startswith("# Tell me about owls\n")
    assert str(chosen) in window.statusBar().currentMessage()


def test_file_export_chat_adds_the_suffix_of_the_chosen_format(ready_window, qtbot, monkeypatch, tmp_path):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(tmp_path / "owls"), "JSON (*.json)"))
    window.export_chat_action.trigger()
    assert json.loads((tmp_path / "owls.json").read_text(encoding="utf-8"))["conversation"]["title"] == "Tell me about owls"


def test_an_export_that_fails_says_so_and_the_chat_is_untouched(ready_window, qtbot, monkeypatch, tmp_path):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    nowhere = tmp_path / "no-such-folder" / "owls.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(nowhere), "Markdown (*.md)"))
    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _parent, title, text, *rest: warnings.append((title, text)))
    window.export_chat_action.trigger()
    assert warnings and warnings[0][0] == "Export failed"
    assert str(nowhere) in warnings[0][1] and "no such file or directory" in warnings[0][1]
    assert "Your chats are unchanged" in warnings[0][1]
    assert len(window.store.messages(window.controller.conversation_id)) == 2


def test_export_chat_is_off_until_there_is_a_stored_chat(ready_window, qtbot):
    window = ready_window()
    assert not window.export_chat_action.isEnabled()
    send_and_wait(qtbot, window, "Hello")
    assert window.export_chat_action.isEnabled() and window.export_all_action.isEnabled()


def test_file_export_all_chats_writes_a_folder_and_says_where(ready_window, qtbot, monkeypatch, tmp_path):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args, **kwargs: str(tmp_path))
    window.export_all_action.trigger()
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("tandem-chats-")]
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".md"]
    assert str(folder) in window.statusBar().currentMessage() and "1 chat" in window.statusBar().currentMessage()
