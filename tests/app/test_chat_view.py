"""The chat view keeps the newest message in sight, whatever came before it; the window's
shortcuts work while the message box has the focus."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog

from tests.app.fake_engine import FakeEngine
from tests.app.helpers import last_reply, send_and_wait

LONG_MESSAGE = " ".join(f"word{i}" for i in range(6000))  # about 40,000 characters


def shows_at_the_bottom(window, widget) -> bool:
    """Whether `widget` is wholly inside the chat's viewport, and nothing but margin below it."""
    QApplication.processEvents()
    viewport = window.pane.view.viewport()
    top = widget.mapTo(viewport, widget.rect().topLeft()).y()
    bottom = top + widget.height()
    return 0 <= top and bottom <= viewport.height() and viewport.height() - bottom < 60


def follows(qtbot, window, widget) -> None:
    """The view scrolls `widget` into view at the bottom: not at once, since it follows a
    growth once that is painted (chat_view.FOLLOW_DELAY_MS later), so on a busy machine the
    scroll may come after the reply's last signal."""
    qtbot.waitUntil(lambda: shows_at_the_bottom(window, widget), timeout=2000)


@pytest.mark.parametrize("speed_panel", ["shown", "hidden"])
def test_replies_after_a_very_long_message_stream_in_view(ready_window, qtbot, speed_panel):
    window = ready_window(FakeEngine(reply="A short reply."))
    window.speed_panel.setVisible(speed_panel == "shown")
    send_and_wait(qtbot, window, LONG_MESSAGE)
    seen_while_streaming: list[bool] = []
    window.client.text_delta.connect(lambda *_: seen_while_streaming.append(shows_at_the_bottom(window, last_reply(window))))
    send_and_wait(qtbot, window, "And now a short question")
    assert seen_while_streaming and all(seen_while_streaming[1:])
    follows(qtbot, window, last_reply(window))


def test_after_a_restart_the_last_reply_of_a_long_conversation_is_in_view(make_window, qtbot, tandem_home):
    window = make_window(FakeEngine(reply="A short reply."))
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    send_and_wait(qtbot, window, LONG_MESSAGE)
    send_and_wait(qtbot, window, "And now a short question")
    window.close()
    # The offscreen screen is 800 pixels wide, and a restored window keeps to it; without the
    # saved layout the window opens at its default width, and the wider the view, the more
    # space a long message used to leave blank below the conversation.
    (tandem_home / "config" / "window.ini").unlink()

    again = make_window(FakeEngine(reply="A short reply."))
    qtbot.waitUntil(lambda: again.client.pair is not None, timeout=5000)
    follows(qtbot, again, last_reply(again))


def test_the_windows_shortcuts_work_while_the_message_box_has_the_focus(ready_window, qtbot, monkeypatch):
    window = ready_window()
    send_and_wait(qtbot, window, "Tell me about owls")
    exports = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: exports.append(args) or ("", ""))
    box = window.pane.input
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    box.setPlainText("a draft")
    qtbot.keyClick(box, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert len(exports) == 1 and box.toPlainText() == "a draft"
    # With X11's and GNOME's key bindings the box claims Ctrl+E for itself (end of line); the
    # offscreen platform's do not, so here Export takes a key the box claims everywhere.
    window.export_chat_action.setShortcut(QKeySequence.StandardKey.SelectAll)
    qtbot.keyClick(box, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    assert len(exports) == 2 and box.textCursor().selectedText() == ""
    # A key no action of the window answers to stays the box's.
    window.export_chat_action.setShortcut(QKeySequence("Ctrl+E"))
    qtbot.keyClick(box, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    assert len(exports) == 2 and box.textCursor().selectedText() == "a draft"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_conversation_sits_on_the_palettes_base_colour(ready_window, qtbot, theme):
    """The message column paints its own background (app/chat_view.py's MessageColumn), in the
    theme's base colour, as a text area's."""
    window = ready_window(FakeEngine(reply="A short reply."))
    window.set_theme(theme)
    send_and_wait(qtbot, window, "Hello")
    view = window.pane.view
    qtbot.wait(20)
    picture = view.viewport().grab().toImage()
    corner = picture.pixelColor(2, picture.height() - 2)  # the column's margin, below the reply
    assert corner == view.widget().palette().base().color()
