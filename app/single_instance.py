"""One Tandem per data folder: a second launch brings the running window to the front and exits.

Two windows on one data folder would write the same chat database and settings file, so the
first instance holds a lock file there and listens on a local socket; a later launch finds
the lock taken, connects, asks for the window, waits for the answer and exits.

A crash leaves both the lock and the socket behind. QLockFile reads the process id in the
lock and takes over a lock whose process is gone; the new owner then removes the dead
socket before listening on it. The socket's name is derived from the data folder, so
instances with different TANDEM_HOME folders (the tests) never meet.
"""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Qt, Signal, Slot
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

LOCK_FILE = "instance.lock"
SHOW_WINDOW = b"show-window\n"
WINDOW_SHOWN = b"window-shown\n"
# How long a second launch waits for the first to answer: the first may have just taken the
# lock and not be listening yet, or be busy for a moment on the GUI thread.
ANSWER_TIMEOUT_S = 10.0
RETRY_INTERVAL_S = 0.1


def server_name(data_folder: Path) -> str:
    """A local socket name for `data_folder`: short, since Unix sockets allow about 100 bytes."""
    digest = hashlib.sha256(str(data_folder.resolve()).encode()).hexdigest()[:16]
    return f"tandem-{digest}"


class SingleInstance(QObject):
    """`claim()` once at start; the owner gets `show_requested` for each later launch."""

    show_requested = Signal()

    def __init__(self, data_folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.lock = QLockFile(str(data_folder / LOCK_FILE))
        # Only a dead owner makes the lock stale: the default would also take over the lock
        # of a Tandem that has simply been running for more than 30 seconds.
        self.lock.setStaleLockTime(0)
        self.name = server_name(data_folder)
        self.server: QLocalServer | None = None

    def claim(self) -> bool:
        """Become the running instance; False when a live process already is."""
        if not self.lock.tryLock(0):
            return False
        QLocalServer.removeServer(self.name)  # a crashed owner's socket file
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if server.listen(self.name):
            server.newConnection.connect(self._accept)
            self.server = server
        else:
            # The lock alone still keeps a second Tandem off the data folder; that one will
            # say it got no answer instead of showing this window.
            print(f"tandem: later launches cannot reach this window: local socket {self.name}: "
                  f"{server.errorString()}", file=sys.stderr)
        return True

    def owner_pid(self) -> int | None:
        """The process that holds the lock, as the lock file says."""
        pid, _host, _application = self.lock.getLockInfo()  # pid 0: no readable lock file
        return pid or None

    def ask_owner_to_show(self, timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
        """From a second launch: ask the running instance to bring its window to the front.
        True once it has answered that it did."""
        deadline = time.monotonic() + timeout_s
        while True:
            socket = QLocalSocket()
            socket.connectToServer(self.name)
            if socket.waitForConnected(500):
                socket.write(SHOW_WINDOW)
                socket.flush()
                remaining_ms = max(int((deadline - time.monotonic()) * 1000), 100)
                answered = _read_line(socket, remaining_ms) == WINDOW_SHOWN
                socket.disconnectFromServer()
                return answered
            if time.monotonic() >= deadline:
                return False
            time.sleep(RETRY_INTERVAL_S)

    def release(self) -> None:
        if self.server is not None:
            self.server.close()  # removes the socket file
            self.server = None
        self.lock.unlock()

    @Slot()
    def _accept(self) -> None:
        while self.server is not None and self.server.hasPendingConnections():
            connection = self.server.nextPendingConnection()
            connection.disconnected.connect(connection.deleteLater)
            connection.readyRead.connect(self._answer)
            if connection.canReadLine():  # the request came with the connection
                self._answer_on(connection)

    @Slot()
    def _answer(self) -> None:
        self._answer_on(self.sender())

    def _answer_on(self, connection: QLocalSocket) -> None:
        while connection.canReadLine():
            if bytes(connection.readLine().data()) == SHOW_WINDOW:
                self.show_requested.emit()
                connection.write(WINDOW_SHOWN)
                connection.flush()


def _read_line(socket: QLocalSocket, timeout_ms: int) -> bytes:
    deadline = time.monotonic() + timeout_ms / 1000
    while not socket.canReadLine():
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not socket.waitForReadyRead(left_ms):
            return b""
    return bytes(socket.readLine().data())


def bring_to_front(window: QWidget) -> None:
    """Un-minimise, raise and focus `window` (a window manager may still only flash it)."""
    window.setWindowState(window.windowState() & ~Qt.WindowState.WindowMinimized | Qt.WindowState.WindowActive)
    window.show()
    window.raise_()
    window.activateWindow()
