"""One Tandem per data folder: a second `tandem` brings the first one's window to the front
and exits; a lock left by a crash is taken over; a lock of a live Tandem is not, however old."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from PySide6.QtNetwork import QLocalSocket

from app.single_instance import LOCK_FILE, SHOW_WINDOW, WINDOW_SHOWN, SingleInstance, bring_to_front
from engine.paths import data_dir

ROOT = Path(__file__).resolve().parents[2]


def start_in_child(code: str, home: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "TANDEM_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, text=True, **popen)


def test_a_second_launch_shows_the_running_window_and_exits(make_window, qtbot, tandem_home):
    window = make_window()
    instance = SingleInstance(data_dir())
    assert instance.claim()
    instance.show_requested.connect(lambda: bring_to_front(window))
    window.showMinimized()
    assert window.isMinimized()
    try:
        second = subprocess.Popen(
            [sys.executable, "-m", "app"], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "TANDEM_HOME": str(tandem_home), "QT_QPA_PLATFORM": "offscreen"},
        )
        # The second launch blocks on our answer, so this process keeps its event loop running meanwhile.
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=60_000)
        _out, err = second.communicate()
    finally:
        instance.release()
    assert second.returncode == 0, err
    assert "already running; its window was brought to the front" in err
    assert not window.isMinimized() and window.isVisible()


def test_the_lock_and_socket_of_a_crashed_instance_are_taken_over(qtbot, tmp_path):
    crashed = start_in_child(
        f"""
        import os, signal
        from pathlib import Path
        from PySide6.QtCore import QCoreApplication
        from app.single_instance import SingleInstance
        app = QCoreApplication([])
        instance = SingleInstance(Path({str(tmp_path)!r}))
        assert instance.claim()
        print(instance.server.fullServerName(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        tmp_path, stdout=subprocess.PIPE,
    )
    socket_path = Path(crashed.stdout.readline().strip())
    assert crashed.wait(30) == -9
    assert (tmp_path / LOCK_FILE).exists() and socket_path.exists()  # what the crash left behind

    instance = SingleInstance(tmp_path)
    assert instance.claim()
    try:
        assert instance.owner_pid() == os.getpid()
        client = QLocalSocket()
        client.connectToServer(instance.name)
        qtbot.waitUntil(lambda: client.state() == QLocalSocket.LocalSocketState.ConnectedState, timeout=5000)
        with qtbot.waitSignal(instance.show_requested, timeout=5000):
            client.write(SHOW_WINDOW)
        qtbot.waitUntil(client.canReadLine, timeout=5000)
        assert bytes(client.readLine().data()) == WINDOW_SHOWN
    finally:
        instance.release()
    assert not socket_path.exists()


def test_a_live_instance_keeps_its_lock_however_long_it_has_run(tmp_path):
    holder = start_in_child(
        f"""
        import sys
        from pathlib import Path
        from PySide6.QtCore import QCoreApplication
        from app.single_instance import SingleInstance
        app = QCoreApplication([])
        instance = SingleInstance(Path({str(tmp_path)!r}))
        assert instance.claim()
        print("claimed", flush=True)
        sys.stdin.read()  # hold the lock until the test closes stdin
        """,
        tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        hour_ago = (tmp_path / LOCK_FILE).stat().st_mtime - 3600
        os.utime(tmp_path / LOCK_FILE, (hour_ago, hour_ago))  # Qt's default would call this lock stale
        second = SingleInstance(tmp_path)
        assert not second.claim()
        assert second.owner_pid() == holder.pid
    finally:
        holder.stdin.close()
        holder.wait(30)
