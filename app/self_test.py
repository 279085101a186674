"""The app reporting on itself, for the desktop bundle's smoke test (tests/packaging).

With TANDEM_SELF_TEST set to a message, the app types that message into the chat box and
presses Enter as soon as its window is up (a message sent while the pair loads waits for
it, as a user's does), and writes what happens to stdout, one JSON object per line:

    {"event": "window-shown", "seconds": 1.2}
    {"event": "load-step", "seconds": 1.3, "message": "Starting the engine…"}
    {"event": "pair-loaded", "seconds": 6.0, "pair": "demo", "description": {...}}
    {"event": "reply", "seconds": 7.1, "text": "...", "method": "tree", "tokens": 9, "stop_reason": "eos"}
    {"event": "failed", "seconds": 7.1, "message": "..."}   (a load or a reply that failed)

`seconds` count from the start of the process. Nothing else changes: the reply is the one
the window shows and the chat database keeps, and the app goes on running afterwards, as
after any reply (the smoke test ends it with SIGTERM).
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import psutil
from PySide6.QtCore import QEvent, QObject, Qt, Slot
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication

from engine.config import PairConfig
from engine.events import Finished

from .error_text import error_text
from .main_window import MainWindow
from .worker import PairInfo

SELF_TEST_VARIABLE = "TANDEM_SELF_TEST"


class SelfTest(QObject):
    """Sends `message` through `window` once `start()` runs, and reports on `out`."""

    def __init__(self, window: MainWindow, message: str, out: TextIO = sys.stdout):
        super().__init__(window)
        self.window = window
        self.message = message
        self.out = out
        self._process_start = psutil.Process().create_time()
        client = window.client
        client.load_progress.connect(self._on_load_progress)
        client.pair_loaded.connect(self._on_pair_loaded)
        client.load_failed.connect(self._on_load_failed)
        client.finished.connect(self._on_finished)
        client.errored.connect(self._on_errored)

    @Slot()
    def start(self) -> None:
        self._report("window-shown")
        box = self.window.pane.input
        box.setPlainText(self.message)
        enter = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_Return, Qt.KeyboardModifier.NoModifier)
        QApplication.sendEvent(box, enter)

    @Slot(str, object)
    def _on_load_progress(self, message: str, _fraction: float | None) -> None:
        self._report("load-step", message=message)

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._report("pair-loaded", pair=info.config.name, description=info.description)

    @Slot(object, object)
    def _on_load_failed(self, config: PairConfig, error: Exception) -> None:
        self._report("failed", message=f"loading {config.name}: {error_text(error)}")

    @Slot(int, object, object)
    def _on_finished(self, _request_id: int, event: Finished, _description: dict) -> None:
        shown = self.window.pane.view.messages[-1].text  # what the window shows, after the controller ran
        self._report("reply", text=shown, method=event.stats.method, tokens=len(event.token_ids),
                     stop_reason=event.stop_reason)

    @Slot(int, object)
    def _on_errored(self, _request_id: int, error: Exception) -> None:
        self._report("failed", message=error_text(error))

    def _report(self, event: str, **fields: Any) -> None:
        seconds = round(time.time() - self._process_start, 2)
        self.out.write(json.dumps({"event": event, "seconds": seconds, **fields}, default=str) + "\n")
        self.out.flush()
