"""Starting the app where Qt cannot open a window: one clear line, not a Qt abort; and the
setup's advice on which system packages to install."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.qt_platform import debian_package, install_advice, missing_from_ldd

LDD_OUTPUT = """\
\tlinux-vdso.so.1 (0x00007ffd5a1f2000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f0c1c000000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f0c1bf00000)
\tlibxcb-icccm.so.4 => not found
\tlibxkbcommon-x11.so.0 => not found
"""


def start_app(platform: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["QT_QPA_PLATFORM"] = platform
    return subprocess.run(
        [sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's platform plugins are a Linux matter")
@pytest.mark.parametrize("platform", ["xcb", "no-such-platform"])
def test_without_a_usable_platform_plugin_the_app_says_why_in_one_line(platform):
    result = start_app(platform)
    assert result.returncode == 1  # not 134: Qt did not abort
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tandem: cannot open a window")


def test_missing_libraries_are_read_from_ldd_once_each():
    assert missing_from_ldd(LDD_OUTPUT) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxkbcommon-x11.so.0"]


@pytest.mark.parametrize(
    ("library", "package"),
    [
        ("libxcb-cursor.so.0", "libxcb-cursor0"),
        ("libxcb-icccm.so.4", "libxcb-icccm4"),
        ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
        ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
        ("libX11-xcb.so.1", "libx11-xcb1"),
        ("libglib-2.0.so.0", "libglib2.0-0"),
    ],
)
def test_each_library_maps_to_its_debian_package(library, package):
    assert debian_package(library) == package


def test_the_advice_is_one_apt_command_where_apt_exists(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    advice = install_advice(["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert advice.endswith("sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1")


def test_setup_runs_the_check_and_never_fails_on_it():
    setup = open(os.path.join(os.path.dirname(__file__), "..", "..", "packaging", "setup.sh"), encoding="utf-8").read()
    assert ".venv/bin/python -m app.qt_platform" in setup
