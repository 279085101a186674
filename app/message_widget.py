"""One message in the chat: markdown with copyable code blocks (or provenance colours), its
status, its speed figures (a compact line that expands), and its actions."""
from __future__ import annotations

import html
import math
import time

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import figures as fmt
from engine import methods

from .markdown_blocks import Block, split_blocks, with_line_breaks
from .provenance import Runs, coloured_html
from .storage import EXACT, FAILED, INTERRUPTED, STOPPED, STREAMING, StoredMessage

RENDER_INTERVAL_MS = 40  # streamed text is re-rendered at most this often
STATUS_TEXT = {STREAMING: "writing…", STOPPED: "stopped", INTERRUPTED: "interrupted", FAILED: "error"}
APPROXIMATE_TIP = (
    "Written by SPRINTER: tokens its learned verifier passed went out without the target checking them, "
    "so this reply may differ from what the target alone would write. Colour tokens shows which ones."
)


def is_dark() -> bool:
    """Whether the app's palette is dark. Asked of the app, not a widget: style sheets give
    widgets transparent backgrounds, which would read as black."""
    return QGuiApplication.palette().window().color().lightness() < 128


# Message text is laid out height-for-width. Its vertical size policy must not be Minimum:
# that makes a label's size hint (its height at a guessed width of about 80 characters) a
# minimum, and the chat's scroll area sizes its content to the sum of those minimums. A long
# message at a wider width then left thousands of blank pixels below the conversation, and
# the view, following the bottom, scrolled into them.
TEXT_SIZE_POLICY = (QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)


class MessageText(QLabel):
    """A message's word-wrapped, selectable text, which remembers its height at each width.

    Whenever the streaming reply grows, the chat's layout asks every message for its height at
    the view's width (Qt drops the layout's own cache of those heights on every change), and a
    label lays its whole text out again to answer: in one chat of ten turns (`tandem gui-bench`,
    the demo pair) the window's thread spent 6% of a core during the first reply and 18% during
    the tenth, laying out the earlier messages' unchanged text about twice per update. Their
    heights are now looked up (6-9% over the ten); text, font and style changes forget them."""

    def __init__(self, text_format: Qt.TextFormat):
        super().__init__()
        self._heights: dict[int, int] = {}
        self.setTextFormat(text_format)
        self.setWordWrap(True)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard
        )
        self.setSizePolicy(*TEXT_SIZE_POLICY)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._heights.clear()
        super().setText(text)

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt's name)
        height = self._heights.get(width)
        if height is None:
            height = self._heights[width] = self._laid_out_height(width)
        return height

    def _laid_out_height(self, width: int) -> int:
        """The height QLabel works out by laying the text out at `width`."""
        return super().heightForWidth(width)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._heights.clear()
        super().changeEvent(event)


class CodeBlock(QFrame):
    """A fenced code block: monospace text and a button that copies it."""

    def __init__(self, block: Block):
        super().__init__()
        self.setObjectName("codeBlock")
        self.kind = "code"
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.setSpacing(2)
        header = QHBoxLayout()
        self.language = QLabel()
        self.language.setObjectName("codeLanguage")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.clicked.connect(self._copy)
        header.addWidget(self.language)
        header.addStretch()
        header.addWidget(self.copy_button)
        layout.addLayout(header)
        self.code = MessageText(Qt.TextFormat.PlainText)
        self.code.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout.addWidget(self.code)
        self._copied_timer = QTimer(self, singleShot=True, interval=1500)
        self._copied_timer.timeout.connect(lambda: self.copy_button.setText("Copy"))
        self.set_block(block)

    def set_block(self, block: Block) -> None:
        self.language.setText(block.language or "code")
        if self.code.text() != block.text:
            self.code.setText(block.text)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code.text())
        self.copy_button.setText("Copied")
        self._copied_timer.start()


class ProseBlock(MessageText):
    def __init__(self, block: Block):
        super().__init__(Qt.TextFormat.MarkdownText)
        self.kind = "prose"
        self.set_block(block)

    def set_block(self, block: Block) -> None:
        text = with_line_breaks(block.text)
        if self.text() != text:
            self.setText(text)


class MarkdownView(QWidget):
    """Markdown as prose labels and code blocks. Re-rendering reuses the widgets whose kind
    is unchanged, so a streaming reply only updates its last block."""

    def __init__(self):
        super().__init__()
        # Transparent, so what it shows is its blocks': when a block grows, only the new
        # strip and the blocks that moved are painted, not the whole reply (see MessageColumn).
        self.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self.blocks: list[CodeBlock | ProseBlock] = []

    def set_markdown(self, text: str) -> None:
        wanted = split_blocks(text)
        for index, block in enumerate(wanted):
            if index < len(self.blocks) and self.blocks[index].kind == block.kind:
                self.blocks[index].set_block(block)
                continue
            for stale in self.blocks[index:]:
                self._layout.removeWidget(stale)
                stale.deleteLater()
            del self.blocks[index:]
            widget = CodeBlock(block) if block.kind == "code" else ProseBlock(block)
            self.blocks.append(widget)
            self._layout.addWidget(widget)
        for stale in self.blocks[len(wanted) :]:
            self._layout.removeWidget(stale)
            stale.deleteLater()
        del self.blocks[len(wanted) :]


class FiguresLine(QWidget):
    """The final speed figures of a reply: one line, with the full table on demand."""

    def __init__(self):
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        row = QHBoxLayout()
        self.summary = QLabel()
        self.summary.setObjectName("figuresSummary")
        self.summary.setWordWrap(True)
        self.toggle = QToolButton()
        self.toggle.setText("Details")
        self.toggle.setCheckable(True)
        self.toggle.setToolTip("Show all figures of this reply")
        row.addWidget(self.summary, 1)
        row.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(row)
        self.details = QLabel()
        self.details.setObjectName("figuresDetails")
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setWordWrap(True)  # else its widest row widens the whole chat past the window
        self.details.setSizePolicy(*TEXT_SIZE_POLICY)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setVisible(False)
        layout.addWidget(self.details)
        self.toggle.toggled.connect(self.details.setVisible)

    def set_figures(self, figures: dict) -> None:
        self.summary.setText(fmt.compact_line(figures))
        rows = "".join(
            f"<tr><td style='padding-right:12px'><b>{html.escape(name)}</b></td><td>{html.escape(value)}</td></tr>"
            for name, value in fmt.detail_rows(figures)
        )
        self.details.setText(f"<table>{rows}</table>")


class LimitNotice(QLabel):
    """Under a reply that stopped at the token limit: says so, that Continue (on the last
    reply) writes more of it, and where to raise the limit for the next ones."""

    settings_requested = Signal()

    def __init__(self):
        super().__init__()
        self.setObjectName("limitNotice")
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)
        self.linkActivated.connect(lambda _link: self.settings_requested.emit())
        self.limit: int | None = None
        self.setVisible(False)

    def show_limit(self, limit: int | None) -> None:
        self.limit = limit
        if limit is not None:
            self.clear()  # the same text again would be ignored, and a theme change needs it re-laid
            self.setText(
                f"Stopped at the {limit}-token limit. Continue writes more of the last reply; for "
                "longer replies, raise “Max new tokens” in <a href='settings:decoding'>Settings → Decoding</a>."
            )
        self.setVisible(limit is not None)


class MessageWidget(QFrame):
    regenerate_requested = Signal()
    continue_requested = Signal()
    edit_requested = Signal(int)  # message id
    limit_settings_requested = Signal()  # the token-limit notice's link
    content_shown = Signal()  # the text was handed to the widgets that show it (`tandem gui-bench` times these)

    def __init__(self, message: StoredMessage, show_provenance: bool):
        super().__init__()
        self.message_id = message.id
        self.role = message.role
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        if message.role == "assistant":
            # A reply has no background or border of its own (a question's bubble has, and is
            # painted whole): as it grows, only its new strip and the rows that moved are painted.
            self.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        self._text = message.content
        self._runs: Runs = list(message.provenance)
        self._show_provenance = show_provenance
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self.render)
        self._rendered_at = -math.inf

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        header = QHBoxLayout()
        author = QLabel("You" if message.role == "user" else "Tandem")
        bold = QFont(author.font())
        bold.setBold(True)
        author.setFont(bold)
        self.status = QLabel()
        self.status.setObjectName("messageStatus")
        self.status.setWordWrap(True)
        header.addWidget(author)
        self.badge = QLabel()
        self.badge.setObjectName("approximateBadge")
        self.badge.setToolTip(APPROXIMATE_TIP)
        self.show_verifier(message.verifier)
        header.addWidget(self.badge)
        header.addWidget(self.status, 1)
        layout.addLayout(header)

        self.markdown = MarkdownView()
        self.plain = MessageText(Qt.TextFormat.PlainText)  # user messages, as typed
        self.coloured = MessageText(Qt.TextFormat.RichText)  # provenance colouring
        for body in (self.markdown, self.plain, self.coloured):
            layout.addWidget(body)

        self.limit_notice = LimitNotice()
        self.limit_notice.settings_requested.connect(self.limit_settings_requested)
        layout.addWidget(self.limit_notice)

        self.figures_line = FiguresLine()
        self.figures_line.setVisible(False)
        layout.addWidget(self.figures_line)

        actions = QHBoxLayout()
        actions.setSpacing(4)
        self.copy_button = self._action("Copy", "Copy this message as text", self._copy)
        self.regenerate_button = self._action("Regenerate", "Write this reply again", self.regenerate_requested.emit)
        self.continue_button = self._action(
            "Continue", "Write more of this reply: the model carries on where the token limit stopped it", self.continue_requested.emit
        )
        self.edit_button = self._action("Edit", "Edit this message and send it again", lambda: self.edit_requested.emit(self.message_id))
        for button in (self.copy_button, self.regenerate_button, self.continue_button, self.edit_button):
            actions.addWidget(button)
        actions.addStretch()
        layout.addLayout(actions)
        self.set_actions(can_regenerate=False, can_edit=False)
        self.set_status(message.status, message.note)
        if message.figures:
            self.set_figures(message.figures)
        self.render()

    def _action(self, text: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    @property
    def text(self) -> str:
        return self._text

    def set_content(self, text: str, runs: Runs) -> None:
        """New streamed text: shown now when the last showing is RENDER_INTERVAL_MS old, else
        when it will be (one wake-up of the window's thread per showing, never more)."""
        self._text, self._runs = text, runs
        if self._render_timer.isActive():
            return
        wait_ms = RENDER_INTERVAL_MS - (time.perf_counter() - self._rendered_at) * 1000
        if wait_ms <= 0:
            self.render()
        else:
            self._render_timer.start(int(wait_ms) + 1)

    def set_show_provenance(self, show: bool) -> None:
        self._show_provenance = show
        self.render()

    def render(self) -> None:
        self._render_timer.stop()
        self._rendered_at = time.perf_counter()
        coloured = self._show_provenance and self.role == "assistant" and bool(self._runs)
        self.plain.setVisible(self.role == "user")
        self.coloured.setVisible(coloured)
        self.markdown.setVisible(self.role == "assistant" and not coloured)
        if self.role == "user":
            self.plain.setText(self._text)
        elif coloured:
            self.coloured.setText(coloured_html(self._text, self._runs, is_dark()))
        else:
            self.markdown.set_markdown(self._text)
        self.content_shown.emit()

    def restyle(self) -> None:
        """The theme changed: rich text takes its colours (links, provenance) when it is set."""
        self.limit_notice.show_limit(self.limit_notice.limit)
        self.render()

    def set_status(self, status: str, note: str = "", activity: str = "") -> None:
        """`activity`, when given, says what a streaming reply is doing instead of "writing…"."""
        words = activity or STATUS_TEXT.get(status, "")
        if note:
            words = f"{words} — {note}" if words else note
        self.status.setText(words)
        self.status.setProperty("failed", status == FAILED)
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)

    def set_figures(self, figures: dict) -> None:
        self.figures_line.set_figures(figures)
        self.figures_line.setVisible(True)
        self.limit_notice.show_limit(fmt.token_limit(figures))

    def show_verifier(self, verifier: str) -> None:
        """Badge a reply an approximate verifier wrote (any of it: a continued one too)."""
        if verifier != EXACT:
            self.badge.setText(f"approximate — {methods.BY_NAME[verifier].title if verifier in methods.BY_NAME else verifier}")
        self.badge.setVisible(verifier != EXACT)

    @property
    def stopped_at_limit(self) -> bool:
        return self.limit_notice.limit is not None

    def set_actions(self, can_regenerate: bool, can_edit: bool, can_continue: bool = False) -> None:
        self.regenerate_button.setVisible(self.role == "assistant" and can_regenerate)
        self.continue_button.setVisible(self.role == "assistant" and can_continue)
        self.edit_button.setVisible(self.role == "user" and can_edit)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
