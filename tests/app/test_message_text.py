"""A streaming reply costs the window only its own text: the earlier messages' text is neither
laid out (each label remembers its height at each width, app/message_widget.py; the chat's size
hint keeps to its width, app/chat_view.py) nor painted again (the chat scrolls by moving pixels)."""
from __future__ import annotations

from collections import Counter

import numpy
import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QFont, QImage, QPixmap
from PySide6.QtWidgets import QApplication, QMainWindow, QWidget

from app.chat_view import ChatView
from app.message_widget import MessageText
from app.style import stylesheet
from app.storage import COMPLETE, STREAMING, StoredMessage

PARAGRAPH = "The quick brown fox jumps over the lazy dog, and then it keeps on running. " * 6


@pytest.fixture
def laid_out(monkeypatch):
    """Counts, per label, the heights worked out by laying its text out."""
    counts: Counter = Counter()
    own = MessageText._laid_out_height

    def counting(self, width):
        counts[self] += 1
        return own(self, width)

    monkeypatch.setattr(MessageText, "_laid_out_height", counting)
    return counts


def test_a_height_is_worked_out_once_per_width_and_again_after_a_change(qapp, laid_out):
    label = MessageText(Qt.TextFormat.MarkdownText)
    label.setText(PARAGRAPH)
    at_300 = label.heightForWidth(300)
    assert label.heightForWidth(300) == at_300 and laid_out[label] == 1
    assert label.heightForWidth(150) > at_300 and laid_out[label] == 2  # narrower: more lines

    label.setText(PARAGRAPH * 2)
    assert label.heightForWidth(300) > at_300 and laid_out[label] == 3

    bigger = QFont(label.font())
    bigger.setPointSizeF(bigger.pointSizeF() * 2)
    label.setFont(bigger)
    assert label.heightForWidth(300) > 0 and laid_out[label] == 4


def test_a_streaming_reply_does_not_lay_out_the_earlier_messages_again(qapp, laid_out):
    view = ChatView()
    view.resize(700, 400)
    view.show()
    earlier = []
    for index in range(8):  # taller than the view: its scroll bar is there from the start
        role = "user" if index % 2 == 0 else "assistant"
        message = StoredMessage(index + 1, 1, role, PARAGRAPH * 2, [], None, COMPLETE, "")
        earlier.append(view.add_message(message))
    reply = view.add_message(StoredMessage(9, 1, "assistant", "", [], None, STREAMING, ""))
    for _ in range(3):  # the layout, then the scroll bar it calls for, then the width that leaves
        QApplication.processEvents()
    assert view.verticalScrollBar().isVisible()
    earlier_labels = [label for widget in earlier for label in widget.findChildren(MessageText)]
    laid_out.clear()

    updates = 30
    for words in range(1, updates + 1):
        reply.set_content(" ".join(["streaming"] * (words * 8)), [])
        reply.render()
        QApplication.processEvents()

    assert sum(laid_out[label] for label in reply.findChildren(MessageText)) >= updates  # the reply grew
    # The earlier messages are asked for their height at each update, at the width they have:
    # they never lay their text out again (before the chat's size hint kept to its width, they
    # did whenever the reply's first line widened: at the narrower width the hint asked for).
    assert max(laid_out[label] for label in earlier_labels) == 0
    view.close()


class PaintCounter(QObject):
    """Counts the paint events of `watched`; a child of their view, so that it goes with the
    view, never outliving it as a filter of widgets another test makes."""

    def __init__(self, watched, view):
        super().__init__(view)
        self.paints = 0
        for widget in watched:
            widget.installEventFilter(self)

    def eventFilter(self, watched, event):  # noqa: N802 (Qt's name)
        self.paints += event.type() == QEvent.Type.Paint
        return False


def test_a_reply_streaming_at_the_bottom_of_a_long_chat_paints_only_itself(qapp, qtbot):
    view = ChatView()
    qtbot.addWidget(view)  # closed and deleted after the test, also when it fails
    view.setStyleSheet(stylesheet(view.palette()))  # as the app's: styled widgets paint differently
    view.resize(700, 400)
    view.show()
    earlier = [
        view.add_message(StoredMessage(index + 1, 1, "user" if index % 2 == 0 else "assistant", PARAGRAPH, [], None, COMPLETE, ""))
        for index in range(8)
    ]
    reply = view.add_message(StoredMessage(9, 1, "assistant", "", [], None, STREAMING, ""))
    qtbot.wait(50)
    earlier_widgets = [child for widget in earlier for child in (widget, *widget.findChildren(QWidget))]
    counter = PaintCounter(earlier_widgets, view)
    scroll_bar = view.verticalScrollBar()
    start = scroll_bar.value()

    for words in range(1, 31):
        reply.set_content(" ".join(["streaming"] * (words * 8)), [])
        reply.render()
        qtbot.wait(15)  # the view follows once the change is painted (chat_view.FOLLOW_DELAY_MS)

    # It followed the reply down (a follow timer may still be due on a busy machine).
    qtbot.waitUntil(lambda: scroll_bar.value() > start and scroll_bar.value() == scroll_bar.maximum(), timeout=2000)
    # The messages above scrolled by moving their pixels, with nothing of theirs painted again
    # (they were, whole, at each line the reply grew by).
    assert counter.paints == 0
    view.close()


MARKDOWN_REPLY = ("Intro paragraph with **bold** words.\n\n```python\nprint('x')\nfor i in range(3):\n    pass\n```\n\n"
                  "A closing paragraph that runs on for a while, long enough to wrap in the view. ") * 2


def pixels(picture: QPixmap) -> numpy.ndarray:
    image = picture.toImage().convertToFormat(QImage.Format.Format_RGB888)
    rows = numpy.frombuffer(bytes(image.constBits())[: image.sizeInBytes()], numpy.uint8).reshape(image.height(), -1)
    return rows[:, : image.width() * 3].reshape(image.height(), image.width(), 3)


def test_what_the_window_shows_is_what_a_fresh_paint_shows(qapp, qtbot):
    """The chat repaints only what changed and scrolls by moving pixels: nothing it leaves on
    screen may differ from painting the window afresh, while a reply streams, after resizes and
    while scrolling."""
    window = QMainWindow()
    view = ChatView()
    window.setCentralWidget(view)
    window.setGeometry(0, 0, 700, 500)
    window.show()
    for index in range(6):
        role = "user" if index % 2 == 0 else "assistant"
        view.add_message(StoredMessage(index + 1, 1, role, "A question?" if role == "user" else MARKDOWN_REPLY,
                                       [], None, COMPLETE, ""))
    reply = view.add_message(StoredMessage(7, 1, "assistant", "", [], None, STREAMING, ""))
    qtbot.wait(50)

    def on_screen_as_painted() -> bool:
        shown, fresh = pixels(qapp.primaryScreen().grabWindow(window.winId())), pixels(window.grab())
        # A rounded corner cut by the view's edge may be anti-aliased a shade apart when painted
        # in part: a pixel or two. Anything left behind by a move or a resize is rows of them.
        return shown.shape == fresh.shape and int((shown != fresh).any(axis=2).sum()) <= 4

    # Each check waits for the window's pending paints (a busy machine delays them): what is
    # left on screen then stays there until something else changes.
    for step in range(1, 41):
        reply.set_content(MARKDOWN_REPLY[: step * 12], [])
        qtbot.wait(10)
        qtbot.waitUntil(on_screen_as_painted, timeout=2000)
    for size in ((600, 450), (780, 580), (650, 520)):  # within the offscreen screen's 800 × 600
        window.resize(*size)
        qtbot.waitUntil(on_screen_as_painted, timeout=2000)
    for value in range(view.verticalScrollBar().maximum(), -1, -37):
        view.verticalScrollBar().setValue(value)
        qtbot.wait(5)
    qtbot.waitUntil(on_screen_as_painted, timeout=2000)
    window.close()
