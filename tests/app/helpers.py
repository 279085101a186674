"""Small actions on the main window shared by the GUI tests."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument

from app.main_window import MainWindow


def send(qtbot, window: MainWindow, text: str) -> None:
    """Type `text` and press Enter, as a user would."""
    window.pane.input.setPlainText(text)
    qtbot.keyClick(window.pane.input, Qt.Key.Key_Return)


def send_and_wait(qtbot, window: MainWindow, text: str, timeout: int = 5000):
    with qtbot.waitSignal(window.client.finished, timeout=timeout) as finished:
        send(qtbot, window, text)
    return finished.args[1]


def last_reply(window: MainWindow):
    return window.pane.view.messages[-1]


def shown_markdown(widget) -> str:
    """The text a message widget shows, across its prose (as rendered markdown) and code blocks."""
    widget.render()
    shown = []
    for block in widget.markdown.blocks:
        if block.kind == "code":
            shown.append(block.code.text())
        else:
            assert block.textFormat() == Qt.TextFormat.MarkdownText
            document = QTextDocument()
            document.setMarkdown(block.text())
            shown.append(document.toPlainText())
    return "\n".join(shown)
