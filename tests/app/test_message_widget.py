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


def stored_reply(window):
    return window.store.messages(window.controller.conversation_id)[-1]


def test_continue_carries_on_a_reply_cut_at_the_limit_in_the_same_message(ready_window, qtbot):
    engine = FakeEngine(reply="one two three four five six seven eight nine")
    window = ready_window(engine)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=4))
    send_and_wait(qtbot, window, "Count")
    reply = last_reply(window)
    assert reply.continue_button.isVisible() and reply.regenerate_button.isVisible()

    with qtbot.waitSignal(window.client.finished, timeout=5000):
        reply.continue_button.click()
    asked, _settings, _system = engine.requests[-1]
    assert (asked[-1].role, asked[-1].content) == ("assistant", "one two three four")  # the reply so far, to carry on
    assert stored_reply(window).content == "one two three four five six seven eight"
    assert [m.role for m in window.store.messages(window.controller.conversation_id)] == ["user", "assistant"]
    assert last_reply(window) is reply and reply.text == "one two three four five six seven eight"
    assert reply.limit_notice.isVisible() and reply.continue_button.isVisible()  # the limit again

    with qtbot.waitSignal(window.client.finished, timeout=5000):
        reply.continue_button.click()
    assert stored_reply(window).content == "one two three four five six seven eight nine"
    assert stored_reply(window).status == COMPLETE
    assert not reply.limit_notice.isVisible() and not reply.continue_button.isVisible()  # it ended on its own


def test_continue_is_offered_on_the_last_reply_only_and_only_after_the_limit(ready_window, qtbot):
    window = ready_window(FakeEngine(reply="one two three four five"))
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=3))
    send_and_wait(qtbot, window, "Count")
    first = last_reply(window)
    send_and_wait(qtbot, window, "Again")
    assert first.limit_notice.isVisibleTo(window) and not first.continue_button.isVisible()
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=50))
    send_and_wait(qtbot, window, "Once more")
    assert not last_reply(window).continue_button.isVisible()  # ended on its own


def test_a_failed_continue_keeps_the_reply_as_it_was(ready_window, qtbot):
    engine = FakeEngine(reply="one two three four five six seven eight")
    window = ready_window(engine)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=3))
    send_and_wait(qtbot, window, "Count")
    engine.fail_after_tokens = 0
    with qtbot.waitSignal(window.client.errored, timeout=5000):
        last_reply(window).continue_button.click()
    reply = stored_reply(window)
    assert reply.content == "one two three" and reply.status == COMPLETE and reply.figures
    assert "out of memory" in window.pane.banner.text.lower()
    qtbot.waitUntil(lambda: last_reply(window).continue_button.isVisible(), timeout=5000)  # and can be tried again


def test_a_continue_stopped_before_it_wrote_anything_leaves_the_reply_to_continue_again(ready_window, qtbot):
    engine = FakeEngine(reply="one two three four five six", reading_chunks=3, token_delay_s=0.2)
    window = ready_window(engine)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=3))
    send_and_wait(qtbot, window, "Count")
    reply = last_reply(window)
    with qtbot.waitSignal(window.client.finished, timeout=10000):
        reply.continue_button.click()
        window.controller.stop()  # while the prompt is read, before any text
    saved = stored_reply(window)
    assert saved.content == "one two three" and saved.status == COMPLETE and saved.figures["stop_reason"] == "length"
    assert reply.limit_notice.isVisible() and reply.continue_button.isVisible()


def test_a_reply_cut_inside_a_character_is_continued_from_before_it(ready_window, qtbot):
    """The limit can cut a character's bytes: the reply then ends in U+FFFD, which the model
    is not shown; it writes the character again."""
    engine = FakeEngine(reply="one two three four")
    window = ready_window(engine)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=2))
    send_and_wait(qtbot, window, "Count")
    message = stored_reply(window)
    window.store.finish_reply(message.id, "one two\ufffd", message.provenance, message.figures, message.status)
    window.controller.open_conversation(window.controller.conversation_id)
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        last_reply(window).continue_button.click()
    asked = engine.requests[-1][0]
    assert asked[-1].content == "one two\ufffd"  # the engine drops it (chat_prompt.reply_to_continue)
    assert "\ufffd" not in stored_reply(window).content
