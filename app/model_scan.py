"""Looking for models on this machine without blocking the window.

A scan reads the headers of every model in the usual places (engine/discovery): milliseconds
each, but a slow or network disk can make the whole take seconds, so it runs on a Python
thread of its own and its result crosses back as a queued signal. The thread is a daemon: a
scan only reads, and must never keep the app from quitting. The last result is kept, so a
picker opened again shows it at once while a fresh scan runs.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.discovery import Found, discover
from engine.discovery.folders import search_folders
from engine.discovery.locations import model_roots

_last: dict[tuple, Found] = {}  # by what was searched: the roots and the added folders


def _what_is_searched() -> tuple:
    return tuple(root.folder for root in model_roots()), tuple(search_folders())


def last_found() -> Found | None:
    """The last scan of the places searched now, if there was one."""
    return _last.get(_what_is_searched())


class ModelScan(QObject):
    found = Signal(object)  # engine.discovery.Found
    failed = Signal(object)  # Exception: shown, never swallowed

    def start(self) -> None:
        threading.Thread(target=self._run, name="model scan", daemon=True).start()

    def _run(self) -> None:
        searched = _what_is_searched()
        try:
            result = discover(searched[1])
        except Exception as error:  # any failure is reported to the picker, which stays usable
            self._emit("failed", error)
            return
        _last[searched] = result
        self._emit("found", result)

    def _emit(self, signal_name: str, value: object) -> None:
        try:
            getattr(self, signal_name).emit(value)
        except RuntimeError:
            pass  # the picker closed while the scan ran: nobody is waiting for it
