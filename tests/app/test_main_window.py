"""The main window over a fake engine: chatting, stopping, regenerating, editing, errors,
switching pairs and methods, and what a restart restores."""
from __future__ import annotations

import re
import sqlite3
import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox, QToolBar

from app.settings import load_settings
from app.storage import COMPLETE, FAILED, STOPPED
from engine.config import ModelSpec, PairConfig
from engine.errors import ModelLoadError
from engine.pairs import save_user_pairs
from tests.app.fake_engine import FakeEngine, words
from tests.app.helpers import last_reply, send, send_and_wait, shown_markdown


def test_first_start_loads_the_demo_pair_with_visible_progress(make_window, qtbot):
    window = make_window(FakeEngine(load_delay_s=0.3))
    assert window.load_progress.isVisible()
    assert "Loading" in window.pane.view.placeholder.text()
    assert not window.pane.send_button.isEnabled()
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    assert not window.load_progress.isVisible()
    assert window.load_label.text().startswith("Ready")
    assert window.load_label.text().count("EAGLE-3 head") == 1  # the demo's head, named once
    assert "EAGLE-3 head smollm2-135m-eagle3" in window.load_label.text()
    assert window.pane.send_button.isEnabled()
    assert window.windowTitle() == "Tandem — demo"


def test_a_reply_streams_as_markdown_with_stats_in_order(ready_window, qtbot):
    window = ready_window(FakeEngine(token_delay_s=0.005))
    seen: list[str] = []
    window.client.prompt_prepared.connect(lambda *_: seen.append("prompt"))
    window.client.text_delta.connect(lambda *_: seen.append("text"))
    window.client.stats_updated.connect(lambda *_: seen.append("stats"))
    window.client.finished.connect(lambda *_: seen.append("finished"))
    texts: list[str] = []
    window.client.text_delta.connect(lambda *_: texts.append(last_reply(window).text))

    finished = send_and_wait(qtbot, window, "Explain speculative decoding")

    assert re.fullmatch(r"prompt text( text| stats)* stats finished", " ".join(seen))
    assert all(len(a) < len(b) for a, b in zip(texts, texts[1:]))  # the reply grew delta by delta
    reply = last_reply(window)
    shown = shown_markdown(reply)
    assert "short" in shown and "**" not in shown  # rendered, not raw markdown
    assert "print('hello from the fake engine')" in shown
    # The intro and its list, the table (a paragraph of its own), the code, the last line.
    assert [block.kind for block in reply.markdown.blocks] == ["prose", "prose", "code", "prose"]
    assert reply.figures_line.isVisible() and "tok/s" in reply.figures_line.summary.text()
    assert window.speed_panel.speed.text().endswith("tok/s")
    assert window.speed_panel.rate_series.count() > 1
    assert window.speed_panel.position_set.count() == 4
    assert finished.stop_reason == "eos"
    assert window.pane.input.toPlainText() == ""
    assert window.conversations.list.currentItem().text() == "Explain speculative decoding"


def test_a_long_prompt_shows_how_far_reading_it_got_until_the_reply_starts(ready_window, qtbot):
    window = ready_window(FakeEngine(token_delay_s=0.005, reading_chunks=4))
    seen: list[str] = []
    window.client.prompt_progress.connect(
        lambda *_: seen.append(f"{last_reply(window).status.text()} | {window.speed_panel.caption.text()}")
    )
    window.client.text_delta.connect(lambda *_: seen.append(f"text, {last_reply(window).status.text()}"))
    send_and_wait(qtbot, window, "A long document…")
    # The status and the speed panel say the same; time left once the reading has advanced.
    left = " · about 1 s left"
    reading = [f"Reading your message… {p} | Reading your message… {p}"
               for p in ("0%", f"25%{left}", f"50%{left}", f"75%{left}", "100%")]
    assert seen[: len(reading)] == reading
    assert set(seen[len(reading):]) == {"text, writing…"}  # the first text ends the reading
    assert "Reading" not in window.speed_panel.caption.text()


def test_code_blocks_and_messages_can_be_copied(ready_window, qtbot):
    window = ready_window()
    send_and_wait(qtbot, window, "Show code")
    reply = last_reply(window)
    code_block = next(block for block in reply.markdown.blocks if block.kind == "code")
    code_block.copy_button.click()
    assert QApplication.clipboard().text() == "print('hello from the fake engine')"
    reply.copy_button.click()
    assert QApplication.clipboard().text() == FakeEngine().reply


def test_stop_keeps_what_was_written(ready_window, qtbot):
    window = ready_window(FakeEngine(token_delay_s=0.03))
    send(qtbot, window, "Go on")
    qtbot.waitUntil(lambda: len(last_reply(window).text) > 10, timeout=5000)
    assert window.pane.stop_button.isVisible() and not window.pane.send_button.isVisible()
    with qtbot.waitSignal(window.client.finished, timeout=2000):
        window.pane.stop_button.click()
    saved = window.store.messages(window.controller.conversation_id)[-1]
    assert saved.status == STOPPED
    assert 0 < len(words(saved.content)) < len(words(FakeEngine().reply))
    assert "stopped" in last_reply(window).status.text()
    assert window.pane.send_button.isVisible() and window.pane.send_button.isEnabled()


def test_regenerate_replaces_the_last_reply(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    send_and_wait(qtbot, window, "Hello")
    first_id = last_reply(window).message_id
    assert last_reply(window).regenerate_button.isVisible()
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        last_reply(window).regenerate_button.click()
    messages = window.store.messages(window.controller.conversation_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[-1].id != first_id and messages[-1].status == COMPLETE
    assert engine.requests[0][0] == engine.requests[1][0]  # the same conversation, asked again


def test_the_last_question_can_be_edited_and_sent_again(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    send_and_wait(qtbot, window, "What is the capital of Frnace?")
    question = window.pane.view.messages[0]
    assert question.edit_button.isVisible()
    question.edit_button.click()
    assert window.pane.input.toPlainText() == "What is the capital of Frnace?"
    assert window.pane.edit_notice.isVisible()
    send_and_wait(qtbot, window, "What is the capital of France?")
    messages = window.store.messages(window.controller.conversation_id)
    assert [(m.role, m.content) for m in messages][0] == ("user", "What is the capital of France?")
    assert len(messages) == 2 and len(window.pane.view.messages) == 2
    assert [m.content for m in engine.requests[-1][0]] == ["What is the capital of France?"]


def test_the_system_prompt_belongs_to_its_conversation(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    window.pane.system_prompt_toggle.click()
    window.pane.system_prompt.setPlainText("Answer in French.")
    send_and_wait(qtbot, window, "Hello")
    assert engine.requests[-1][2] == "Answer in French."
    first = window.controller.conversation_id
    window.controller.new_conversation()
    assert window.pane.system_prompt.toPlainText() == ""
    send_and_wait(qtbot, window, "Hello again")
    assert engine.requests[-1][2] is None
    window.controller.open_conversation(first)
    assert window.pane.system_prompt.toPlainText() == "Answer in French."


def test_switching_method_applies_to_the_next_reply(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    # A first start decodes with auto, which every pair offers.
    assert window.settings.decoding.method == "auto"
    assert window.decode_settings().method == window.method_combo.currentData() == "auto"
    window.method_combo.setCurrentIndex(window.method_combo.findData("ar"))
    window.method_combo.activated.emit(window.method_combo.currentIndex())
    finished = send_and_wait(qtbot, window, "Hi")
    assert engine.requests[-1][1].method == "ar" and finished.stats.method == "ar"
    assert "ar drafts nothing" in window.speed_panel.values["acceptance"].text()
    assert {p.value for p in finished.provenance} == {"target"}


def test_replies_are_sampled_by_default_and_greedy_is_one_click_away(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    toolbar = window.findChild(QToolBar, "mainToolbar")
    assert toolbar.widgetForAction(window.greedy_action).isVisible()
    assert not window.greedy_action.isChecked()
    send_and_wait(qtbot, window, "Hi")
    assert engine.requests[-1][1].temperature == 0.7

    window.greedy_action.trigger()  # one click
    assert window.greedy_action.isChecked()
    assert window.method_combo.currentData() == window.decode_settings().method == "auto"  # unchanged
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        window.regenerate_action.trigger()
    assert engine.requests[-1][1].temperature == 0.0
    assert load_settings()[0].decoding.temperature == 0.0  # kept across restarts

    window.greedy_action.trigger()
    assert not window.greedy_action.isChecked() and window.decode_settings().temperature == 0.7


def test_the_greedy_toggle_follows_a_temperature_set_in_settings(ready_window):
    window = ready_window()
    window.set_decoding(window.settings.decoding.with_changes(temperature=0.0))
    assert window.greedy_action.isChecked()
    window.set_decoding(window.settings.decoding.with_changes(temperature=1.2))
    assert not window.greedy_action.isChecked()
    window.greedy_action.trigger()
    window.greedy_action.trigger()
    assert window.decode_settings().temperature == 1.2  # greedy off goes back to the user's own temperature


def test_the_pair_switch_widens_to_fit_pair_names_added_later(ready_window):
    window = ready_window()
    name = "qwen2.5-7b-instruct + 0.5b draft"  # longer than the switch's first width
    save_user_pairs([PairConfig(name, ModelSpec("/models/qwen-7b.gguf"), ModelSpec("/models/qwen-0.5b.gguf"))])
    window._on_pairs_changed()  # as after saving a pair in Settings
    combo = window.pair_combo
    text_width = combo.fontMetrics().horizontalAdvance(name)
    assert combo.itemText(combo.findData(name)) == name
    assert combo.sizeHint().width() > text_width
    combo.showPopup()
    try:
        assert combo.view().viewport().width() > text_width  # the open list shows it whole too
    finally:
        combo.hidePopup()
    assert "/models/qwen-0.5b.gguf" in combo.itemData(combo.findData(name), Qt.ItemDataRole.ToolTipRole)


def test_a_pair_name_too_long_for_the_toolbar_is_elided_with_its_whole_name_in_the_tooltip(ready_window):
    window = ready_window()
    name = "a pair whose name goes on " + "and on " * 20
    save_user_pairs([PairConfig(name, ModelSpec("/models/long.gguf"))])
    window._on_pairs_changed()
    combo = window.pair_combo
    index = combo.findData(name)
    assert "…" in combo.itemText(index) and len(combo.itemText(index)) < len(name)
    assert combo.itemData(index, Qt.ItemDataRole.ToolTipRole).startswith(name)
    assert combo.sizeHint().width() < combo.fontMetrics().horizontalAdvance(name)


def test_switching_pair_loads_it_while_the_chat_stays_usable(make_window, qtbot):
    save_user_pairs([PairConfig("bigger", ModelSpec("/models/bigger"))])
    engine = FakeEngine()
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    send_and_wait(qtbot, window, "Hi")
    engine.load_delay_s = 0.4
    window.pair_combo.setCurrentIndex(window.pair_combo.findData("bigger"))
    window.pair_combo.activated.emit(window.pair_combo.currentIndex())
    assert window.load_progress.isVisible()
    assert window.client.pair.config.name == "demo"  # still active while the new one loads
    window.conversations.search.setText("Hi")  # the rest of the window responds meanwhile
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        pass
    window.conversations.search.clear()
    assert window.client.pair.config.name == "bigger" and window.settings.active_pair == "bigger"
    send_and_wait(qtbot, window, "Hi again")
    assert engine.requests[-1][0][0].content == "Hi"


def test_a_failing_load_says_why_and_keeps_the_previous_pair(make_window, qtbot):
    save_user_pairs([PairConfig("broken", ModelSpec("/models/broken.gguf"))])
    engine = FakeEngine(failing_sources={"/models/broken.gguf": ModelLoadError("Model file not found: /models/broken.gguf")})
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    with qtbot.waitSignal(window.client.load_failed, timeout=5000):
        window.pair_combo.setCurrentIndex(window.pair_combo.findData("broken"))
        window.pair_combo.activated.emit(window.pair_combo.currentIndex())
    banner = window.pane.banner.text
    assert "Could not load “broken”" in banner and "Model file not found" in banner and "Still using “demo”" in banner
    assert window.client.pair.config.name == "demo" and window.pair_combo.currentData() == "demo"
    assert window.settings.active_pair == "demo"
    send_and_wait(qtbot, window, "Still there?")


def test_an_engine_error_mid_reply_is_shown_and_nothing_is_lost(ready_window, qtbot):
    engine = FakeEngine(fail_after_tokens=4)
    window = ready_window(engine)
    with qtbot.waitSignal(window.client.errored, timeout=5000):
        send(qtbot, window, "Write a lot")
    assert window.pane.banner.text.startswith("Out of memory")
    messages = window.store.messages(window.controller.conversation_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[-1].status == FAILED and messages[-1].content
    assert "error" in last_reply(window).status.text()
    engine.fail_after_tokens = None
    send_and_wait(qtbot, window, "Try again")
    assert [m.content for m in engine.requests[-1][0]] == ["Write a lot", "Try again"]


def test_a_streaming_reply_is_saved_as_it_streams_for_a_process_killed_mid_reply(ready_window, qtbot, tandem_home):
    window = ready_window(FakeEngine(reply=" ".join(f"word{i}" for i in range(200)), token_delay_s=0.05))
    send(qtbot, window, "Stream")

    def saved() -> tuple[str, str]:
        # What a process killed now would leave behind, read by another connection.
        return sqlite3.connect(tandem_home / "data" / "chats.sqlite3").execute(
            "SELECT content, status FROM messages WHERE role='assistant'"
        ).fetchone()

    qtbot.waitUntil(lambda: saved()[0] != "", timeout=5000)  # once a second, not at the end only
    content, status = saved()
    assert status == "streaming" and last_reply(window).text.startswith(content)
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        window.pane.stop_button.click()
    assert saved() == (last_reply(window).text, "stopped")


def test_conversations_can_be_searched_renamed_and_deleted(ready_window, qtbot, monkeypatch):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    window.controller.new_conversation()
    send_and_wait(qtbot, window, "Tell me about cats")
    titles = lambda: [window.conversations.list.item(i).text() for i in range(window.conversations.list.count())]
    assert titles() == ["Tell me about cats", "Tell me about owls"]

    window.conversations.search.setText("owls")
    assert titles() == ["Tell me about owls"]
    window.conversations.search.setText("fake engine")  # matches message text, not only titles
    assert len(titles()) == 2
    window.conversations.search.clear()

    item = window.conversations.list.item(0)
    window.conversations.list.setCurrentItem(item)
    cats = window.conversations.current_id()
    item.setText("Cats")  # what finishing an in-place edit does
    assert window.store.conversation(cats).title == "Cats"
    assert window.pane.title.text() == "Cats"

    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)
    window.conversations.delete_button.click()
    assert titles() == ["Tell me about owls"]
    assert window.pane.title.text() == "Tell me about owls"


def test_provenance_colouring_shows_draft_and_target_tokens(ready_window, qtbot):
    window = ready_window()
    send_and_wait(qtbot, window, "Colour me")
    reply = last_reply(window)
    assert not reply.coloured.isVisible() and not window.legend.isVisible()
    window.provenance_action.trigger()
    assert reply.coloured.isVisible() and not reply.markdown.isVisible()
    assert window.legend.isVisible()
    html = reply.coloured.text()
    assert "#c8efc8" in html and "#ffe0b3" in html  # draft and target tints
    window.provenance_action.trigger()
    assert reply.markdown.isVisible()


def test_restart_restores_conversations_selection_and_layout(make_window, qtbot):
    window = make_window()
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    send_and_wait(qtbot, window, "First conversation")
    first = window.controller.conversation_id
    window.controller.new_conversation()
    send_and_wait(qtbot, window, "Second conversation")
    window.conversations.refresh(first)
    window.controller.open_conversation(first)
    window.speed_panel.hide()
    window.resize(720, 590)  # inside the offscreen screen (800 x 600), which restoreGeometry keeps to
    size = window.size()
    window.close()

    again = make_window()
    assert again.controller.conversation_id == first
    assert again.conversations.current_id() == first
    assert [w.text for w in again.pane.view.messages][0] == "First conversation"
    assert again.conversations.list.count() == 2
    assert not again.speed_panel.isVisible()
    assert again.size() == size and size.width() == 720
    assert last_reply(again).figures_line.isVisible()  # the reply's figures stay with it


def test_closing_mid_reply_stops_the_engine_and_keeps_the_text(make_window, qtbot):
    engine = FakeEngine(token_delay_s=0.05)
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    send(qtbot, window, "Long answer please")
    qtbot.waitUntil(lambda: len(last_reply(window).text) > 10, timeout=5000)
    shown = last_reply(window).text
    started = time.perf_counter()
    window.close()
    assert time.perf_counter() - started < 1.0
    assert engine.closed_pairs == ["demo"]
    again = make_window()
    saved = again.store.messages(again.controller.conversation_id)[-1]
    assert saved.status == STOPPED and saved.content == shown


def test_a_streaming_reply_is_written_to_the_chats_file_about_once_a_second_and_whole_at_its_end(ready_window, qtbot):
    reply = " ".join(f"word{i}" for i in range(60))
    window = ready_window(FakeEngine(reply=reply, token_delay_s=0.08))  # rounds of 1-5 words: about 1.6 s
    writes = []
    store_write = window.store.update_reply
    window.store.update_reply = lambda message_id, text, runs: writes.append(text) or store_write(message_id, text, runs)
    send_and_wait(qtbot, window, "Count for me", timeout=10_000)
    assert 1 <= len(writes) <= 2  # a commit per delta would be 60
    assert reply.startswith(writes[0]) and len(writes[0]) < len(reply)
    saved = window.store.messages(window.controller.conversation_id)[-1]
    assert saved.status == COMPLETE and saved.content == reply


def test_a_corrupt_chat_file_is_kept_aside_and_the_app_opens_with_a_fresh_one(make_window, qtbot, tandem_home):
    chats = tandem_home / "data" / "chats.sqlite3"
    chats.parent.mkdir(parents=True)
    chats.write_bytes(b"\x13\x37 not sqlite at all " * 500)
    window = make_window()
    kept = next(chats.parent.glob("chats-set-aside-*"))
    assert kept.read_bytes().startswith(b"\x13\x37")
    assert window.pane.banner.isVisible()
    assert str(kept) in window.pane.banner.text
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    send_and_wait(qtbot, window, "Still works?")
    assert window.store.messages(window.controller.conversation_id)[-1].role == "assistant"


def test_every_start_warning_is_shown_not_only_the_last(make_window, tandem_home):
    config = tandem_home / "config"
    config.mkdir(parents=True)
    (config / "app-settings.json").write_text("{ half a settings file", encoding="utf-8")
    (config / "pairs.json").write_text("[ half a pairs file", encoding="utf-8")
    window = make_window()
    shown = window.pane.banner.text
    assert "settings could not be read" in shown
    assert "saved model pairs" in shown


def test_after_an_error_mid_reply_the_speed_panel_no_longer_waits(ready_window, qtbot):
    window = ready_window(FakeEngine(fail_after_tokens=0))
    with qtbot.waitSignal(window.client.errored, timeout=5000):
        send(qtbot, window, "Write a lot")
    assert "Waiting" not in window.speed_panel.caption.text()
    assert "failed" in window.speed_panel.caption.text()


def test_a_load_error_is_a_full_sentence_and_goes_once_a_pair_loads(make_window, qtbot):
    save_user_pairs([PairConfig("broken", ModelSpec("/models/broken.gguf"))])
    engine = FakeEngine(failing_sources={"/models/broken.gguf": ModelLoadError("the tensor layout is not covered")})
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    with qtbot.waitSignal(window.client.load_failed, timeout=5000):
        window.request_pair(window.pair_named("broken"))
    assert "not covered. Still using “demo”." in window.pane.banner.text
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        window.request_pair(window.pair_named("demo"))
    assert not window.pane.banner.isVisible()


def test_a_saved_pair_that_no_longer_loads_falls_back_to_the_demo_pair(make_window, qtbot):
    save_user_pairs([PairConfig("gone", ModelSpec("/models/gone.gguf"))])
    from app.settings import AppSettings, save_settings

    save_settings(AppSettings(active_pair="gone"))
    engine = FakeEngine(failing_sources={"/models/gone.gguf": ModelLoadError("Model file not found: /models/gone.gguf")})
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    assert window.client.pair.config.name == "demo"
    banner = window.pane.banner.text
    assert "Could not load “gone”" in banner and "Using the demo pair instead" in banner
    send_and_wait(qtbot, window, "Hello")


def test_new_chat_stores_nothing_until_its_first_message(ready_window, qtbot):
    window = ready_window()
    for _ in range(3):
        window.new_action.trigger()
    assert window.store.list_conversations() == []
    send_and_wait(qtbot, window, "Now it counts")
    assert [c.title for c in window.store.list_conversations()] == ["Now it counts"]
    assert window.conversations.list.count() == 1


def test_a_message_sent_while_the_pair_loads_is_sent_when_it_is_ready(make_window, qtbot):
    engine = FakeEngine(load_delay_s=0.5)
    window = make_window(engine)
    send(qtbot, window, "Typed during the load")
    assert "sent when the model pair is ready" in window.pane.send_notice.text()
    assert window.pane.send_notice.isVisible()
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        pass
    assert [m.content for m in engine.requests[-1][0]] == ["Typed during the load"]
    assert not window.pane.send_notice.isVisible()
    assert window.pane.input.toPlainText() == ""


def test_line_breaks_of_a_poem_are_kept_without_colouring(ready_window, qtbot):
    poem = "Roses are red,\nviolets are blue,\ndrafts are quick,\nand targets are true."
    window = ready_window(FakeEngine(reply=poem))
    send_and_wait(qtbot, window, "A poem please")
    assert shown_markdown(last_reply(window)).splitlines() == poem.splitlines()


def test_escape_stops_a_streaming_reply_and_keeps_what_was_written(ready_window, qtbot):
    window = ready_window(FakeEngine(token_delay_s=0.05))
    send(qtbot, window, "Write slowly")
    qtbot.waitUntil(lambda: len(last_reply(window).text) > 10, timeout=5000)
    window.conversations.list.setFocus()  # Esc works wherever the focus is in the window
    with qtbot.waitSignal(window.client.finished, timeout=5000) as finished:
        qtbot.keyClick(window.conversations.list, Qt.Key.Key_Escape)
    assert finished.args[1].stop_reason == "stopped"
    stored = window.store.messages(window.controller.conversation_id)[-1]
    assert stored.status == STOPPED and stored.content and stored.content == finished.args[1].text


def test_escape_while_nothing_streams_still_cancels_an_edit(ready_window, qtbot):
    window = ready_window()
    send_and_wait(qtbot, window, "Hello")
    window.pane.view.messages[0].edit_button.click()
    assert window.pane.edit_notice.isVisible()
    qtbot.keyClick(window.pane.input, Qt.Key.Key_Escape)
    assert not window.pane.edit_notice.isVisible() and window.pane.input.toPlainText() == ""


def test_a_pair_that_failed_to_load_is_marked_in_the_pair_box_and_can_be_retried(make_window, qtbot):
    save_user_pairs([PairConfig("broken", ModelSpec("/models/broken.gguf"))])
    engine = FakeEngine(failing_sources={"/models/broken.gguf": ModelLoadError("Model file not found: /models/broken.gguf")})
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    index = window.pair_combo.findData("broken")
    assert window.pair_combo.itemText(index) == "broken"
    with qtbot.waitSignal(window.client.load_failed, timeout=5000):
        window.pair_combo.activated.emit(index)
    index = window.pair_combo.findData("broken")
    assert window.pair_combo.itemText(index) == "⚠ broken — failed to load"
    tip = window.pair_combo.itemData(index, Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith("Failed to load: ") and "Model file not found: /models/broken.gguf" in tip and "retry" in tip
    assert window.pair_combo.itemText(window.pair_combo.currentIndex()) == "demo"  # the good one stays unmarked

    del engine.failing_sources["/models/broken.gguf"]  # the file is back: choosing it again retries
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        window.pair_combo.activated.emit(index)
    assert window.client.pair.config.name == "broken"
    assert window.pair_combo.itemText(window.pair_combo.findData("broken")) == "broken"
