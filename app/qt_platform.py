"""Whether Qt can open a window here, asked before the app creates its QApplication.

When no Qt platform plugin loads, Qt aborts the process (exit code 134) with several lines
about reinstalling. A stock Debian desktop lacks libraries that PySide6's X11 (`xcb`) plugin
needs, so Tandem asks first, in a throwaway process, and says in one line what is wrong.

    python -m app.qt_platform     # what packaging/setup.sh runs: which packages to install

This module does not import Qt itself: a probe that aborts must not take the app with it.
In the desktop bundle the executable is Tandem, not a Python that could run `-c`, so the
probe is that executable again with `BUNDLE_PROBE_ARGUMENT` (packaging/bundle_main.py).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROBE = "import sys; from PySide6.QtGui import QGuiApplication; QGuiApplication(sys.argv[:1])"
BUNDLE_PROBE_ARGUMENT = "--probe-qt-platform"
PROBE_TIMEOUT_S = 60
# Qt 6.5+ opens this one at run time (dlopen), so `ldd` on the plugin never lists it.
LOADED_AT_RUN_TIME = ("libxcb-cursor.so.0",)
# Debian names a library package after the file, lower-cased, with its soname version
# ("libxcb-icccm.so.4" -> "libxcb-icccm4", "-" before the version when the name ends in a
# digit); these do not follow that rule.
DEBIAN_PACKAGE_EXCEPTIONS = {"libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0"}


def debian_package(library: str) -> str:
    """The Debian/Ubuntu package that ships `library` (a file name such as libxcb-icccm.so.4)."""
    if library in DEBIAN_PACKAGE_EXCEPTIONS:
        return DEBIAN_PACKAGE_EXCEPTIONS[library]
    name, _, version = library.partition(".so.")
    name = name.lower()
    version = version.split(".")[0]
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def missing_from_ldd(ldd_output: str) -> list[str]:
    """Library file names that `ldd` reports as "not found", each once, in order."""
    missing = re.findall(r"^\s*(\S+) => not found", ldd_output, flags=re.MULTILINE)
    return list(dict.fromkeys(missing))


def xcb_plugin() -> Path | None:
    """PySide6's X11 platform plugin, if PySide6 is installed and ships one."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    plugin = Path(spec.submodule_search_locations[0]) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def missing_xcb_libraries() -> list[str]:
    """System libraries the xcb plugin needs and this machine lacks (Linux only)."""
    plugin = xcb_plugin()
    if not sys.platform.startswith("linux") or plugin is None or shutil.which("ldd") is None:
        return []
    result = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=False)
    missing = missing_from_ldd(result.stdout)
    for library in LOADED_AT_RUN_TIME:
        try:
            ctypes.CDLL(library)  # loading, not finding: its own dependencies must load too
        except OSError:
            missing.append(library)
    return missing


def install_advice(libraries: list[str]) -> str:
    packages = " ".join(dict.fromkeys(debian_package(library) for library in libraries))
    if shutil.which("apt-get"):
        return f"install them with: sudo apt-get install {packages}"
    return f"install your system's packages for {', '.join(libraries)} (on Debian and Ubuntu: {packages})"


def probe_command() -> list[str]:
    if getattr(sys, "frozen", False):  # a PyInstaller bundle
        return [sys.executable, BUNDLE_PROBE_ARGUMENT]
    return [sys.executable, "-c", PROBE]


def open_gui_platform() -> None:
    """What the probe process does (PROBE, as a function for the bundle): start Qt's GUI
    layer, which aborts the process when no platform plugin loads."""
    from PySide6.QtGui import QGuiApplication

    QGuiApplication(sys.argv[:1])


def platform_problem() -> str | None:
    """None when Qt can start here; otherwise one line that says why not and what to do."""
    if not sys.platform.startswith("linux"):
        return None  # macOS and Windows bring their platform plugin with PySide6
    probe = subprocess.run(
        probe_command(), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
    )
    if probe.returncode == 0:
        return None
    named = re.search(r'Qt platform plugin "([^"]*)"', probe.stderr)
    plugin = named.group(1) if named else os.environ.get("QT_QPA_PLATFORM", "xcb")
    if plugin == "xcb":
        missing = missing_xcb_libraries()
        if missing:
            return f"cannot open a window: Qt's X11 plugin needs {', '.join(missing)}; {install_advice(missing)}"
        if not os.environ.get("DISPLAY"):
            return "cannot open a window: no display (DISPLAY is not set). Start Tandem in a desktop session, or chat in the terminal with `tandem chat`."
    return (f"cannot open a window: Qt could not load its {plugin!r} platform plugin "
            f"(run with QT_DEBUG_PLUGINS=1 to see why, or chat in the terminal with `tandem chat`).")


def main() -> int:
    """For packaging/setup.sh: say which system packages the desktop app still needs. Never
    fails, since `tandem chat` and `tandem bench` run without them."""
    missing = missing_xcb_libraries()
    if missing:
        print(f"The desktop app needs system libraries this machine lacks ({', '.join(missing)}); {install_advice(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
