"""A timer probe of the GUI thread's responsiveness: how late its event loop runs a 10 ms
timer. While the engine streams a reply on the worker, this stays small if the GUI thread
never waits for the engine."""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QTimer

INTERVAL_MS = 10


class EventLoopProbe(QObject):
    def __init__(self):
        super().__init__()
        self.worst_delay_s = 0.0
        self.ticks = 0
        self._last = 0.0
        self._timer = QTimer(self, interval=INTERVAL_MS)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst_delay_s = max(self.worst_delay_s, now - self._last - INTERVAL_MS / 1000)
        self._last = now
        self.ticks += 1
