"""SIGTERM and Ctrl-C close the window as the close button does: the chat being written is
saved, the engine thread stops and is joined, and the app exits with 0.

Python runs a signal handler only when the interpreter next gets control, and a Qt event
loop with nothing to do may not hand it control at all. So the C-level handler's wake-up
byte (signal.set_wakeup_fd) goes to a socket that a QSocketNotifier watches: the event loop
wakes at once, without polling, and the window closes from the GUI thread.
"""
from __future__ import annotations

import signal
import socket

from PySide6.QtCore import QCoreApplication, QObject, QSocketNotifier, Slot
from PySide6.QtWidgets import QWidget

CLOSING_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CloseOnTermination(QObject):
    """Until `restore()`, SIGTERM and SIGINT close `window` and quit the app."""

    def __init__(self, window: QWidget):
        super().__init__(window)
        self.window = window
        self._reader, self._writer = socket.socketpair()
        for end in (self._reader, self._writer):
            end.setblocking(False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._writer.fileno())
        # A Python-level handler must be set, or the default action would end the process
        # before the window could close; the work is done by `_on_wakeup`.
        self._previous_handlers = {number: signal.signal(number, _note_only) for number in CLOSING_SIGNALS}
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._on_wakeup)

    @Slot()
    def _on_wakeup(self) -> None:
        received = self._drain()
        if any(number in received for number in CLOSING_SIGNALS):
            self.window.close()
            QCoreApplication.quit()  # also when a dialog is open and keeps the app alive

    def _drain(self) -> set[int]:
        received: set[int] = set()
        while True:
            try:
                data = self._reader.recv(64)
            except BlockingIOError:
                return received
            if not data:
                return received
            received.update(data)

    def restore(self) -> None:
        """Give the signals back to what handled them before."""
        if self._previous_handlers:
            for number, handler in self._previous_handlers.items():
                signal.signal(number, handler)
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._previous_handlers = {}
            self._notifier.setEnabled(False)
            self._reader.close()
            self._writer.close()


def _note_only(_number: int, _frame: object) -> None:
    """The Python-level handler: nothing to do here, `CloseOnTermination` acts on the wake-up."""
