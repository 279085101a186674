"""A message's text remembers its height at each width, so a streaming reply does not make the
chat lay out every earlier message's text again at each update (app/message_widget.py)."""
from __future__ import annotations

from collections import Counter

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication

from app.chat_view import ChatView
from app.message_widget import MessageText
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
    # The earlier messages are asked for their height at each update. They lay their text out
    # again only while the reply's own preferred width still grows (the chat's preferred width
    # follows it): a few times a reply, not at each update.
    assert max(laid_out[label] for label in earlier_labels) <= updates // 5
    view.close()
