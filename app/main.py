"""`tandem` with no argument: open the desktop app."""
from __future__ import annotations

import os
import sys

from PySide6.QtWidgets import QApplication

from .main_window import MainWindow
from .qt_platform import platform_problem
from .style import stylesheet


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
    app.setStyleSheet(stylesheet(app.palette()))
    window = MainWindow()
    window.show()
    return app.exec()


if __name__ == "__main__":
    raise SystemExit(main())
