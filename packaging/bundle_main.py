"""The desktop bundle's entry point: the `tandem` command, frozen by PyInstaller.

It runs what the installed console command runs (`engine.cli:main`: no argument opens the
app, subcommands run headless), plus one thing only a bundle needs: its executable is
Tandem, not a Python interpreter, so the Qt platform probe that app/qt_platform.py runs
before opening a window, and the llama.cpp worker process (engine/runtime/llamacpp_process.py),
come back to this executable as hidden arguments.
"""
import sys

from app.qt_platform import BUNDLE_PROBE_ARGUMENT, open_gui_platform
from engine.runtime.llamacpp_worker_start import WORKER_ARGUMENT, run_worker as run_llamacpp_worker

if __name__ == "__main__":
    if sys.argv[1:] == [BUNDLE_PROBE_ARGUMENT]:
        open_gui_platform()
        raise SystemExit(0)
    if sys.argv[1:2] == [WORKER_ARGUMENT]:
        raise SystemExit(run_llamacpp_worker(sys.argv[2:]))
    from engine.cli import main

    raise SystemExit(main())
