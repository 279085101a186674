"""What one update of a streaming reply costs the window's thread, by the chat's length.

A chat view in a window with the app's style sheet holds N earlier messages (questions and
markdown answers); a reply then streams into it at 15 updates a second, as the worker sends
them, for UPDATES updates. Printed per N: the window thread's CPU time per update (all of it:
the text handed over, layouts, paints, the view following the reply) and how many paint events
the earlier messages' widgets got.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/bench/chat_update_cost.py [UPDATES]

With docs/bench/two_checkouts.sh, the same in two checkouts, alternating.
"""
from __future__ import annotations

import os
import sys
import time

from PySide6.QtCore import QEvent, QEventLoop, QObject, QTimer
from PySide6.QtWidgets import QApplication, QMainWindow, QWidget

from app.chat_view import ChatView
from app.storage import COMPLETE, STREAMING, StoredMessage
from app.style import stylesheet

ANSWER = ("Here is a short answer with **bold** words and a list of things to consider when you write. " * 3
          + "\n\n") * 3
WORDS = ANSWER.split(" ")
UPDATE_INTERVAL_MS = 66  # the worker's TEXT_INTERVAL_S


class PaintCount(QObject):
    def __init__(self, widgets: list[QWidget]):
        super().__init__()
        self.paints = 0
        for widget in widgets:
            widget.installEventFilter(self)

    def eventFilter(self, _watched, event) -> bool:  # noqa: N802 (Qt's name)
        self.paints += event.type() == QEvent.Type.Paint
        return False


def wait(loop: QEventLoop, ms: int) -> None:
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def one_chat(app: QApplication, earlier_count: int, updates: int) -> tuple[float, int]:
    window = QMainWindow()
    view = ChatView()
    window.setCentralWidget(view)
    window.resize(1280, 800)
    window.show()
    earlier = []
    for index in range(earlier_count):
        role = "user" if index % 2 == 0 else "assistant"
        text = "A question?" if role == "user" else ANSWER
        earlier.append(view.add_message(StoredMessage(index + 1, 1, role, text, [], None, COMPLETE, "")))
    reply = view.add_message(StoredMessage(earlier_count + 1, 1, "assistant", "", [], None, STREAMING, ""))
    loop = QEventLoop()
    wait(loop, 300)
    painted = PaintCount([child for widget in earlier for child in (widget, *widget.findChildren(QWidget))])
    sent = {"updates": 0, "text": ""}

    def next_update() -> None:
        if sent["updates"] == updates:
            loop.quit()
            return
        start = sent["updates"] * 10 % len(WORDS)
        sent["text"] += " ".join(WORDS[start:start + 10]) + " "
        if sent["updates"] % 12 == 11:
            sent["text"] += "\n\n"  # a new paragraph now and then, as replies have
        reply.set_content(sent["text"], [])
        sent["updates"] += 1

    timer = QTimer(interval=UPDATE_INTERVAL_MS)
    timer.timeout.connect(next_update)
    began = time.thread_time()
    timer.start()
    loop.exec()
    timer.stop()
    wait(loop, 100)  # the last update's paint and follow
    seconds = time.thread_time() - began
    window.close()
    window.deleteLater()
    app.processEvents()
    return seconds / updates * 1000, painted.paints


def main() -> None:
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setStyleSheet(stylesheet(app.palette()))
    for earlier_count in (0, 8, 16, 32):
        per_update_ms, paints = one_chat(app, earlier_count, updates)
        print(f"{earlier_count:2d} earlier messages: {per_update_ms:.2f} ms of the window thread per update, "
              f"earlier messages painted {paints} times over {updates} updates")


if __name__ == "__main__":
    main()
