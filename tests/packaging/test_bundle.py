"""The desktop bundle: built by packaging/build_bundle.sh, its executable opens the window
(offscreen), loads the demo pair from inside the bundle on a first start, answers one
message, hands a second launch over to the running window, and exits cleanly within 10 s of
SIGTERM. One test, since the build alone takes minutes; it prints what it measured.

The message goes in through the app's self-test (TANDEM_SELF_TEST, app/self_test.py): the
app types it into the chat box and presses Enter, and reports the reply its window shows.
"""
from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import engine
from app.settings import SETTINGS_FILE, AppSettings, save_settings
from app.storage import DATABASE_FILE, open_chat_store
from engine.config import DecodeSettings
from engine.runtime.forward_plan import measured_here
from engine.runtime.native_forward import NATIVE_NAME

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France? Answer in one sentence."
FIRST_START_TIMEOUT_S = 300  # window, first-start conversion of the demo target, one reply
SIGTERM_DEADLINE_S = 10

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("PyInstaller") is None,
                       reason="PyInstaller is not installed (bash packaging/setup.sh installs it with the dev extra)"),
    pytest.mark.skipif(sys.platform == "win32", reason="the smoke test stops the app with SIGTERM"),
]


def lines_of(stream) -> queue.Queue:
    """The lines of `stream` as they come, read on a thread so that waiting can time out."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def events_until_reply(lines: queue.Queue, timeout_s: float, log: Path) -> list[dict]:
    """The self-test's JSON events up to its reply; fails on a failure event or at the timeout,
    with the app's stderr `log`."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while not events or events[-1]["event"] != "reply":
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        except queue.Empty:
            pytest.fail(f"no reply within {timeout_s} s; events so far: {events}\n{log.read_text()}")
        if line is None:
            pytest.fail(f"the app's output ended before a reply; events: {events}\n{log.read_text()}")
        if line.startswith("{"):
            events.append(json.loads(line))
            assert events[-1]["event"] != "failed", events[-1]["message"]
    return events


def prebuilt_kernel_here() -> bool:
    """Whether build_bundle.sh's kernels include this CPU's variant (a CPU without AVX2 has none)."""
    from engine.runtime import int8_kernel
    from engine.runtime.kernel_build import PREBUILT_DIR, library_name

    return int8_kernel.unavailable_reason() is None and (PREBUILT_DIR / library_name(int8_kernel.chosen_variant())).exists()


@pytest.mark.timeout(1800)
def test_the_bundle_opens_answers_with_the_demo_pair_and_exits_on_sigterm(tmp_path):
    # 1. Build.
    started = time.monotonic()
    subprocess.run(["bash", ROOT / "packaging" / "build_bundle.sh", tmp_path / "dist"], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHON": sys.executable}, timeout=1500)
    build_s = time.monotonic() - started
    bundle = tmp_path / "dist" / "tandem"
    executable = bundle / "tandem"
    size_mb = sum(path.stat().st_size for path in bundle.rglob("*") if path.is_file() and not path.is_symlink()) / 2**20

    # 2. The executable is the `tandem` command: the headless options work too.
    version = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True, timeout=60, cwd=tmp_path)
    assert version.stdout.splitlines()[0] == f"tandem {engine.__version__}"
    assert f"desktop bundle: {bundle}" in version.stdout

    # 3. On Linux, the bundle puts itself in the application menu (here a private XDG_DATA_HOME).
    if sys.platform.startswith("linux"):
        menu = tmp_path / "xdg-data"
        subprocess.run(["bash", bundle / "install-desktop-entry.sh"], env={**os.environ, "XDG_DATA_HOME": str(menu)},
                       check=True, capture_output=True, timeout=60)
        entry = menu / "applications" / "tandem.desktop"
        assert f'Exec="{executable}"\n' in entry.read_text()
        assert (menu / "icons" / "hicolor" / "256x256" / "apps" / "tandem.png").is_file()
        if shutil.which("desktop-file-validate"):
            subprocess.run(["desktop-file-validate", entry], check=True)

    # 4. A first start on an empty data folder, greedy so that the reply is known.
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    save_settings(AppSettings(decoding=DecodeSettings(method="tree", temperature=0.0, max_new_tokens=32)),
                  home / "config" / SETTINGS_FILE)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(QT_QPA_PLATFORM="offscreen", TANDEM_HOME=str(home), TANDEM_SELF_TEST=QUESTION)
    if prebuilt_kernel_here():
        env["CC"] = "no-such-compiler"  # the bundle's prebuilt kernel, not one compiled on first use, runs the target
    log = tmp_path / "app-stderr.txt"  # a file, not a pipe nobody drains while the app runs
    launched = time.monotonic()
    with log.open("w") as stderr:
        app = subprocess.Popen([executable], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=stderr)
    try:
        events = events_until_reply(lines_of(app.stdout), FIRST_START_TIMEOUT_S, log)
        first_reply_s = time.monotonic() - launched
        timeline = {event["event"]: event for event in events}
        loaded = timeline["pair-loaded"]
        # the demo target runs where auto places it on this machine (runtime_choice.unmeasured_prefers_torch)
        assert loaded["pair"] == "demo" and loaded["description"]["runtime"] == (NATIVE_NAME if measured_here() else "llama.cpp")
        steps = [event["message"] for event in events if event["event"] == "load-step"]
        assert f"Loading draft {bundle / '_internal' / 'resources' / 'drafts' / 'smollm2-135m-draft'}…" in steps
        reply = timeline["reply"]
        assert "Paris" in reply["text"] and reply["method"] == "tree"

        # 5. A second launch on the same data folder shows this window instead of opening another.
        env.pop("TANDEM_SELF_TEST")
        second = subprocess.run([executable], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr

        # 6. SIGTERM closes the window and stops the engine thread.
        terminated = time.monotonic()
        app.send_signal(signal.SIGTERM)
        assert app.wait(SIGTERM_DEADLINE_S) == 0, log.read_text()
        exit_s = time.monotonic() - terminated
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()

    store, _warning = open_chat_store(home / "data" / DATABASE_FILE)
    [conversation] = store.list_conversations()
    assert [(m.role, m.content) for m in store.messages(conversation.id)] == [("user", QUESTION), ("assistant", reply["text"])]
    store.close()
    shutil.rmtree(tmp_path / "dist")  # 1 GB; pytest keeps the temporary folders of its last three runs
    print(f"\nbundle: built in {build_s:.0f} s, {size_mb:.0f} MB; first start: window after "
          f"{timeline['window-shown']['seconds']:.1f} s, demo pair loaded after {loaded['seconds']:.1f} s, "
          f"reply after {first_reply_s:.1f} s; exit {exit_s:.1f} s after SIGTERM")
