"""`tandem` with no argument: open the desktop app (one per data folder)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from engine import heap, paths
from engine.paths import data_dir

from .main_window import MainWindow
from .qt_platform import platform_problem
from .self_test import SELF_TEST_VARIABLE, SelfTest
from .single_instance import SingleInstance, bring_to_front
from .style import stylesheet
from .termination import CloseOnTermination

ICON = Path(__file__).resolve().parent.parent / "resources" / "icons" / "tandem.png"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    heap.limit_arenas()  # before the engine thread starts (engine/heap.py)
    paths.keep_compiled_kernels()  # before anything asks inductor for its folder
    # Offline by default: the hub may only be contacted when the user asks for a download.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    app = QApplication.instance()
    if app is None:
        # Qt aborts the process when no platform plugin loads: ask a probe first, and say why.
        problem = platform_problem()
        if problem:
            print(f"tandem: {problem}", file=sys.stderr)
            return 1
        app = QApplication(["tandem", *argv])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    app.setDesktopFileName("tandem")  # Wayland matches the window to tandem.desktop by this
    app.setWindowIcon(QIcon(str(ICON)))
    app.setStyleSheet(stylesheet(app.palette()))

    instance = SingleInstance(data_dir())
    if not instance.claim():
        return _hand_over(instance)
    window = MainWindow()
    instance.show_requested.connect(lambda: bring_to_front(window))
    termination = CloseOnTermination(window)
    message = os.environ.get(SELF_TEST_VARIABLE)
    if message:
        QTimer.singleShot(0, SelfTest(window, message).start)  # once the event loop runs
    window.show()
    try:
        return app.exec()
    finally:
        termination.restore()
        instance.release()


def _hand_over(instance: SingleInstance) -> int:
    """A Tandem is already running on this data folder: show its window instead."""
    if instance.ask_owner_to_show():
        print("tandem: Tandem is already running; its window was brought to the front.", file=sys.stderr)
        return 0
    print(f"tandem: another Tandem (process {instance.owner_pid()}) holds {instance.lock.fileName()} "
          "but did not answer; close it, or end that process if it hangs.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
