"""Fixtures for the desktop app's tests: offscreen Qt, a private TANDEM_HOME per test, and a
check that no test leaves a thread running (after napari's `_dangling_qthreads`)."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading
import traceback

import pytest
from PySide6.QtCore import QEvent, QThread
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.style import stylesheet
from tests.app.fake_engine import FakeEngine


@pytest.fixture(autouse=True)
def tandem_home(tmp_path, monkeypatch):
    """Settings, chats and window layout of this test only."""
    home = tmp_path / "tandem-home"
    monkeypatch.setenv("TANDEM_HOME", str(home))
    # The pair picker looks for models on "this machine": an empty home of the test's own.
    monkeypatch.setenv("TANDEM_SEARCH_HOME", str(tmp_path / "search-home"))
    return home


@pytest.fixture(autouse=True)
def _dangling_threads(qapp, monkeypatch):
    """Fail a test that leaves a QThread or a Python thread running."""
    started: list[tuple[QThread, str]] = []
    original_start = QThread.start

    def recording_start(self, *args):
        started.append((self, "".join(traceback.format_stack(limit=8)[:-1])))
        original_start(self, *args)

    monkeypatch.setattr(QThread, "start", recording_start)
    before = set(threading.enumerate())
    yield
    dangling = []
    for thread, where in started:
        try:
            running = thread.isRunning()
        except RuntimeError:  # its C++ object is gone, so it is not running
            continue
        if running:
            dangling.append(where)
            thread.quit()
            thread.wait(5000)
    leftover = [
        t for t in threading.enumerate()
        if t not in before and t.is_alive() and not t.daemon  # a daemon thread cannot hang the exit
    ]
    assert not dangling, "QThreads still running after the test, started at:\n" + "\n".join(dangling)
    assert not leftover, f"Python threads still running after the test: {leftover}"


@pytest.fixture
def make_window(qtbot):
    """MainWindow factory over a fake engine (or the one given); windows close at teardown."""
    windows: list[MainWindow] = []
    qapp = QApplication.instance()
    qapp.setStyleSheet(stylesheet(qapp.palette()))

    def make(engine=None) -> MainWindow:
        window = MainWindow(engine if engine is not None else FakeEngine())
        windows.append(window)
        window.show()
        return window

    yield make
    for window in windows:
        window.close()
        window.deleteLater()  # delete now, not whenever garbage collection gets to it
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def ready_window(make_window, qtbot):
    """A window whose demo pair (fake) has loaded."""

    def make(engine=None) -> MainWindow:
        window = make_window(engine)
        qtbot.waitUntil(lambda: window.client.pair is not None and window.client.loading is None, timeout=5000)
        return window

    return make
