"""A first start with the real engine: the window opens before the engine's heavy imports,
and the loading line says what the slow one-time steps are, how long they take, and counts."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import engine.models
from app.engine_api import LocalEngine
from engine.errors import ModelLoadError
from engine.runtime import llamacpp_library

CONVERTING = f"Converting the demo model (first start only, {engine.models.DEMO_CONVERSION_ESTIMATE})…"


@pytest.fixture
def slow_conversion(monkeypatch, demo_target_path):
    """A base install (no llama.cpp) converting the demo GGUF for torch; the conversion waits
    until the test releases it, then fails, which ends the load."""
    release = threading.Event()
    monkeypatch.setattr(llamacpp_library, "available", lambda: False)

    def convert(gguf, destination):
        release.wait(10)
        raise ModelLoadError("the test ends the load here")

    monkeypatch.setattr(engine.models, "_convert_gguf", convert)
    yield release
    release.set()


def test_the_conversion_step_says_how_long_it_takes_and_counts_the_seconds(make_window, qtbot, slow_conversion):
    window = make_window(LocalEngine())
    qtbot.waitUntil(lambda: window.load_label.text().startswith(CONVERTING), timeout=60_000)
    assert window.load_label.text() == f"{CONVERTING} 0 s"
    # The clock ticks on the GUI thread, which the loading thread can starve for seconds on a
    # busy 2-core machine: wait for the first tick generously, then check what it says.
    qtbot.waitUntil(lambda: window.load_label.text() != f"{CONVERTING} 0 s", timeout=15_000)
    counted = window.load_label.text()
    assert re.fullmatch(rf"{re.escape(CONVERTING)} [1-9][0-9]* s", counted)
    assert window.load_label.isVisible() and window.load_progress.isVisible()
    assert window.load_label.toolTip().splitlines()[-1] == counted
    with qtbot.waitSignal(window.client.load_failed, timeout=10_000):
        slow_conversion.set()
    assert not window.load_clock.isActive()


def test_the_tandem_command_opens_the_window_without_importing_torch():
    # `tandem` with no argument goes from engine.cli to app.main_window; torch and
    # transformers (3-14 s to import) load on the engine's thread after the window is up.
    code = "import sys, engine.cli, app.main, app.main_window; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.strip() == "[]"
