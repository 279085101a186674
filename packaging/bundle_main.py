"""The desktop bundle's entry point: the `tandem` command, frozen by PyInstaller.

It runs what the installed console command runs (`engine.cli:main`: no argument opens the
app, subcommands run headless), plus one thing only a bundle needs: its executable is
Tandem, not a Python interpreter, so the Qt platform probe that app/qt_platform.py runs
before opening a window comes back to this executable as a hidden argument.
"""
import sys

from app.qt_platform import BUNDLE_PROBE_ARGUMENT, open_gui_platform

if __name__ == "__main__":
    if sys.argv[1:] == [BUNDLE_PROBE_ARGUMENT]:
        open_gui_platform()
        raise SystemExit(0)
    from engine.cli import main

    raise SystemExit(main())
