"""The chat pane: the conversation's messages, its system prompt, an error banner, and the
input box with Send / Stop."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence, QPainter, QPaintEvent, QShortcut
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .message_widget import MessageWidget
from .storage import StoredMessage

FOLLOW_DELAY_MS = 5  # after the window's paint of the change that made the view taller


class MessageColumn(QWidget):
    """The messages, top to bottom: the scroll area's content, drawn so that a streaming reply
    costs the window only the text that changed (issue 45).

    - Its size hint is its layout's at the width it has. Qt's own is the layout's height at the
      layout's preferred width, the widest first line among the messages, which grows as a
      reply streams in: at each such width every earlier message laid its text out again (a
      width no label had cached) and repainted.
    - Its contents are static: when it grows, only the new strip is painted, where Qt painted
      all of it (so, each time the view followed the reply down a line, everything in view).
    - It paints its background itself and says so (an opaque widget): Qt scrolls such a widget
      by moving its pixels, where with a style sheet's background it painted everything again.
    """

    def __init__(self):
        super().__init__()
        self.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        QPainter(self).fillRect(event.rect(), self.palette().base())

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        layout = self.layout()
        preferred = layout.sizeHint()
        if not layout.hasHeightForWidth():
            return preferred
        return QSize(preferred.width(), layout.totalHeightForWidth(self.width()))


class MessageColumnLayout(QVBoxLayout):
    """The column's messages, each at its full height even while the column is shorter.

    When a reply grows, the column lays its messages out before the scroll area makes the
    column taller: a plain box then squeezed every message into the old height for a moment,
    moving and painting them all, and gave them back their heights a moment later."""

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt's name)
        needed = self.heightForWidth(rect.width()) if self.hasHeightForWidth() else rect.height()
        super().setGeometry(rect if needed <= rect.height() else QRect(rect.x(), rect.y(), rect.width(), needed))


class ChatView(QScrollArea):
    """Messages top to bottom; follows a streaming reply while the user is at the bottom."""

    regenerate_requested = Signal()
    continue_requested = Signal()  # the last reply stopped at the token limit: write more of it
    edit_requested = Signal(int)
    limit_settings_requested = Signal()  # a token-limit notice's link to Settings → Decoding

    def __init__(self):
        super().__init__()
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.NoFrame)
        container = MessageColumn()
        container.setObjectName("chatContainer")
        self._layout = MessageColumnLayout(container)
        self._layout.setContentsMargins(16, 12, 16, 12)
        self._layout.setSpacing(10)
        self.placeholder = QLabel()
        self.placeholder.setObjectName("chatPlaceholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self._layout.addWidget(self.placeholder)
        self._layout.addStretch()
        self.setWidget(container)
        self.messages: list[MessageWidget] = []
        self._show_provenance = False
        self._stick_to_bottom = True
        # The view follows a growing reply once its growth is painted: scrolled within the same
        # layout pass, the move found part of the content not yet drawn, and Qt painted all of
        # it again rather than moving its pixels.
        self._follow_timer = QTimer(self, singleShot=True, interval=FOLLOW_DELAY_MS)
        self._follow_timer.timeout.connect(self._to_bottom)
        self.verticalScrollBar().valueChanged.connect(self._remember_position)
        self.verticalScrollBar().rangeChanged.connect(self._follow)

    def set_messages(self, messages: list[StoredMessage]) -> None:
        for widget in self.messages:
            self._layout.removeWidget(widget)
            widget.deleteLater()
        self.messages = []
        for message in messages:
            self.add_message(message)
        self._stick_to_bottom = True
        self._update_placeholder()

    def add_message(self, message: StoredMessage) -> MessageWidget:
        widget = MessageWidget(message, self._show_provenance)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.continue_requested.connect(self.continue_requested)
        widget.edit_requested.connect(self.edit_requested)
        widget.limit_settings_requested.connect(self.limit_settings_requested)
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self.messages.append(widget)
        self._stick_to_bottom = True
        self._update_placeholder()
        return widget

    def remove_messages_from(self, message_id: int) -> None:
        keep = [w for w in self.messages if w.message_id < message_id]
        for widget in self.messages[len(keep) :]:
            self._layout.removeWidget(widget)
            widget.deleteLater()
        self.messages = keep
        self._update_placeholder()

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.messages if w.message_id == message_id), None)

    def set_show_provenance(self, show: bool) -> None:
        self._show_provenance = show
        for widget in self.messages:
            widget.set_show_provenance(show)

    def update_actions(self, idle: bool) -> None:
        """Regenerate (and Continue, where it stopped at the token limit) on the last reply and
        Edit on the last question, when nothing streams."""
        last_reply = next((w for w in reversed(self.messages) if w.role == "assistant"), None)
        last_question = next((w for w in reversed(self.messages) if w.role == "user"), None)
        for widget in self.messages:
            is_last_reply = idle and widget is last_reply and widget is self.messages[-1]
            widget.set_actions(
                can_regenerate=is_last_reply,
                can_edit=idle and widget is last_question,
                can_continue=is_last_reply and widget.stopped_at_limit,
            )

    def set_placeholder_text(self, text: str) -> None:
        self.placeholder.setText(text)
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        self.placeholder.setVisible(not self.messages and bool(self.placeholder.text()))

    def _remember_position(self, value: int) -> None:
        self._stick_to_bottom = value >= self.verticalScrollBar().maximum() - 8

    def _follow(self, _minimum: int, _maximum: int) -> None:
        if self._stick_to_bottom and not self._follow_timer.isActive():
            self._follow_timer.start()

    def _to_bottom(self) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())


class InputBox(QPlainTextEdit):
    """Enter sends; Shift+Enter starts a new line; Escape cancels an edit; a key that one of
    the window's actions answers to (File → Export's Ctrl+E) is the window's."""

    submitted = Signal()
    cancelled = Signal()

    def __init__(self):
        super().__init__()
        self.setPlaceholderText("Message Tandem — Enter sends, Shift+Enter adds a line")
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(self.fontMetrics().lineSpacing() * 4 + 12)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)

    def event(self, event: QEvent) -> bool:
        # A text box claims its editing keys before any shortcut sees them, and with X11's and
        # GNOME's key bindings Ctrl+E is one (end of line): Export did nothing from here.
        if event.type() == QEvent.Type.ShortcutOverride and self._window_answers(event):
            event.ignore()  # not claimed: the window's shortcut runs
            return True
        return super().event(event)

    def _window_answers(self, event: QKeyEvent) -> bool:
        """Whether an enabled action of this window has `event`'s key as its shortcut."""
        if not event.modifiers() & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
                                    | Qt.KeyboardModifier.MetaModifier):
            return False  # typing: no window shortcut is a bare key
        pressed = QKeySequence(event.keyCombination())
        return any(
            shortcut.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch
            for action in self.window().findChildren(QAction) if action.isEnabled()
            for shortcut in action.shortcuts()
        )


class Banner(QFrame):
    """A message across the top of the chat that stays until dismissed: errors, warnings."""

    def __init__(self):
        super().__init__()
        self.setObjectName("banner")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        layout.addWidget(self.label, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_message(self, text: str, kind: str = "error") -> None:
        self.label.setText(text)
        self.setProperty("kind", kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.show()

    @property
    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""


class ChatPane(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    edit_cancelled = Signal()
    system_prompt_edited = Signal(str)

    def __init__(self):
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)

        header = QHBoxLayout()
        header.setContentsMargins(12, 6, 12, 6)
        self.title = QLabel()
        self.title.setObjectName("chatTitle")
        self.system_prompt_toggle = QToolButton()
        self.system_prompt_toggle.setText("System prompt")
        self.system_prompt_toggle.setCheckable(True)
        self.system_prompt_toggle.setToolTip("Instructions the model sees before this conversation")
        header.addWidget(self.title, 1)
        header.addWidget(self.system_prompt_toggle)
        layout.addLayout(header)

        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("System prompt for this conversation (optional), e.g. “Answer briefly.”")
        self.system_prompt.setFixedHeight(self.system_prompt.fontMetrics().lineSpacing() * 3 + 12)
        self.system_prompt.setVisible(False)
        self.system_prompt_toggle.toggled.connect(self.system_prompt.setVisible)
        self.system_prompt.textChanged.connect(lambda: self.system_prompt_edited.emit(self.system_prompt.toPlainText()))
        layout.addWidget(self.system_prompt)

        self.banner = Banner()
        layout.addWidget(self.banner)
        self.view = ChatView()
        layout.addWidget(self.view, 1)

        bottom = QVBoxLayout()
        bottom.setContentsMargins(12, 6, 12, 10)
        bottom.setSpacing(4)
        self.edit_notice = QLabel("Editing your last message: sending replaces it and its reply. Esc cancels.")
        self.edit_notice.setObjectName("editNotice")
        self.edit_notice.setVisible(False)
        bottom.addWidget(self.edit_notice)
        self.send_notice = QLabel()  # why a message waits, or cannot be sent
        self.send_notice.setObjectName("editNotice")
        self.send_notice.setVisible(False)
        bottom.addWidget(self.send_notice)
        # A message that would take long to read says how long before it goes; editing it
        # takes the question back, sending it again answers yes.
        self.long_read_notice = QLabel()
        self.long_read_notice.setObjectName("editNotice")
        self.long_read_notice.setWordWrap(True)
        self.long_read_notice.setVisible(False)
        bottom.addWidget(self.long_read_notice)
        row = QHBoxLayout()
        self.input = InputBox()
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the reply; what was written so far is kept (Esc)")
        # Esc anywhere in the window stops a reply. Enabled only while one streams, so that
        # otherwise Esc still reaches the input box (where it cancels an edit) and the list.
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self, context=Qt.ShortcutContext.WindowShortcut)
        self.stop_shortcut.setEnabled(False)
        self.stop_button.setVisible(False)
        row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch()
        row.addLayout(buttons)
        bottom.addLayout(row)
        layout.addLayout(bottom)

        self.input.submitted.connect(self._submit)
        self.input.cancelled.connect(self.edit_cancelled)
        self.input.textChanged.connect(lambda: self.long_read_notice.setVisible(False))
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_shortcut.activated.connect(self.stop_requested)
        self._can_send = False
        self._loading = False
        self._queued = False  # Enter was pressed while the pair loaded: send once it is ready

    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if not text:
            return
        if self._can_send:
            self.send_requested.emit(text)
        elif self._loading:
            self._queued = True
            self._show_send_notice("Your message will be sent when the model pair is ready.")
        elif not self.stop_button.isVisible():
            self._show_send_notice(self.send_button.toolTip())

    def show_long_read_notice(self, text: str) -> None:
        self.long_read_notice.setText(text)
        self.long_read_notice.setVisible(True)

    def _show_send_notice(self, text: str) -> None:
        self.send_notice.setText(text)
        self.send_notice.setVisible(bool(text))

    def set_state(self, can_send: bool, generating: bool, why_not: str = "", loading: bool = False) -> None:
        self._can_send = can_send
        self._loading = loading
        if can_send or not loading:
            self.send_notice.setVisible(False)
        if self._queued and (can_send or not loading):
            self._queued = False
            if can_send:
                self._submit()
        self.send_button.setEnabled(can_send)
        self.send_button.setToolTip("Send (Enter)" if can_send else why_not)
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)
        self.stop_shortcut.setEnabled(generating)

    def show_conversation(self, title: str, system_prompt: str, messages: list[StoredMessage]) -> None:
        self.title.setText(title)
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(system_prompt)
        self.system_prompt.blockSignals(False)
        self.system_prompt_toggle.setChecked(bool(system_prompt))
        self.view.set_messages(messages)
