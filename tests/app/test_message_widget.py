"""A reply that stops at the token limit says so under itself, with where to raise the limit."""
from __future__ import annotations

from app.storage import COMPLETE
from engine.config import DecodeSettings
from tests.app.fake_engine import FakeEngine, words
from tests.app.helpers import last_reply, send_and_wait


def test_a_reply_cut_at_the_token_limit_says_so_and_links_to_the_setting(ready_window, qtbot):
    window = ready_window(FakeEngine(reply="one two three four five six seven eight"))
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=5))
    finished = send_and_wait(qtbot, window, "Count")
    assert finished.stop_reason == "length" and len(words(finished.text)) == 5
    notice = last_reply(window).limit_notice
    assert notice.isVisibleTo(window)
    assert "Stopped at the 5-token limit" in notice.text() and "Settings → Decoding" in notice.text()
    assert window.store.messages(window.controller.conversation_id)[-1].status == COMPLETE

    notice.linkActivated.emit("settings:decoding")
    dialog = window.settings_dialog
    assert dialog is not None and dialog.isVisible()
    assert dialog.tabs.tabText(dialog.tabs.currentIndex()) == "Decoding"
    assert dialog.decoding.max_new_tokens.hasFocus() or dialog.focusWidget() is dialog.decoding.max_new_tokens
    dialog.reject()


def test_the_notice_comes_back_with_the_chat_after_a_restart(make_window, qtbot):
    window = make_window(FakeEngine(reply="one two three four five six seven eight"))
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=3))
    send_and_wait(qtbot, window, "Count")
    window.close()
    again = make_window(FakeEngine())
    assert "Stopped at the 3-token limit" in last_reply(again).limit_notice.text()
    assert last_reply(again).limit_notice.isVisibleTo(again)


def test_a_reply_that_ended_by_itself_or_was_stopped_shows_no_notice(ready_window, qtbot):
    window = ready_window(FakeEngine(reply="short"))
    send_and_wait(qtbot, window, "Hi")
    assert not last_reply(window).limit_notice.isVisibleTo(window)
