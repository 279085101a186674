"""Settings → Local server: the switch starts `tandem serve` as a child process, the status bar
follows it, and nothing is left running. A stand-in server (tests/app/fake_server.py) takes
the place of `tandem serve`, so no model is loaded; it listens on 127.0.0.1 only."""
from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from app import local_server
from app.local_server import ServerState, reason_from_output
from app.settings import LocalServerSettings, load_settings
from engine.config import ModelSpec, PairConfig
from engine.pairs import all_pairs, save_user_pairs

FAKE_SERVER = Path(__file__).with_name("fake_server.py")
WAIT_MS = 15_000


@pytest.fixture(autouse=True)
def fake_serve(monkeypatch):
    monkeypatch.setattr(local_server, "serve_command_prefix", lambda: [sys.executable, str(FAKE_SERVER)])


@pytest.fixture
def port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def set_server(window, enabled: bool, port: int = 8080, api_key: str = "") -> None:
    """Through the real dialog: Settings → Local server, then OK."""
    dialog = window.open_settings()
    form = dialog.server_form
    dialog.tabs.setCurrentWidget(form)
    form.enabled.setChecked(enabled)
    form.port.setValue(port)
    form.api_key.setText(api_key)
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
        return json.loads(reply.read())


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_serving(qtbot, window, port: int) -> int:
    qtbot.waitUntil(lambda: window.server_label.text() == f"Local server: http://127.0.0.1:{port}/v1", timeout=WAIT_MS)
    return window.local_server.pid()


def test_the_switch_starts_the_server_and_the_status_bar_says_starting_then_where(ready_window, qtbot, port):
    window = ready_window()
    assert not window.server_label.isVisible()  # off by default
    shown: list[str] = []
    window.local_server.changed.connect(lambda: shown.append(window.server_label.text()))
    set_server(window, True, port)
    assert window.server_label.isVisible() and window.server_label.text() == "Local server: starting…"
    pid = wait_serving(qtbot, window, port)
    assert shown[0] == "Local server: starting…" and shown[-1] == f"Local server: http://127.0.0.1:{port}/v1"
    answer = health(port)
    assert answer["pid"] == pid and answer["model"] == "demo"  # the active pair, by name
    assert answer["api_key"] is None
    assert load_settings()[0].local_server.enabled  # kept for the next start


def test_the_api_key_reaches_the_server_but_not_its_command_line(ready_window, qtbot, port):
    window = ready_window()
    set_server(window, True, port, api_key="s3cret")
    wait_serving(qtbot, window, port)
    assert health(port)["api_key"] == "s3cret"
    assert "s3cret" not in " ".join(window.local_server.process.arguments())  # `ps` shows those
    assert load_settings()[0].local_server == LocalServerSettings(enabled=True, port=port, api_key="s3cret")
    form = window.open_settings().server_form  # a new dialog shows what was saved
    assert (form.enabled.isChecked(), form.port.value(), form.api_key.text()) == (True, port, "s3cret")
    window.settings_dialog.reject()


def test_the_switch_is_off_by_default_and_its_port_and_key_wait_for_it(ready_window):
    form = ready_window().open_settings().server_form
    assert not form.enabled.isChecked() and form.port.value() == 8080 and form.api_key.text() == ""
    assert not form.port.isEnabled() and not form.api_key.isEnabled()
    form.enabled.setChecked(True)
    assert form.port.isEnabled() and form.api_key.isEnabled()


def test_a_server_that_cannot_take_its_port_says_why_it_stopped(ready_window, qtbot, port):
    window = ready_window()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        set_server(window, True, port)
        qtbot.waitUntil(lambda: window.local_server.state is ServerState.STOPPED, timeout=WAIT_MS)
    text = window.server_label.text()
    assert text == f"Local server: stopped — port {port} is in use by another program"
    assert "address already in use" in window.server_label.toolTip()  # what the server said
    assert window.local_server.process is None


def test_a_server_that_cannot_be_started_says_so(ready_window, qtbot, monkeypatch, tmp_path):
    monkeypatch.setattr(local_server, "serve_command_prefix", lambda: [str(tmp_path / "no-such-tandem")])
    window = ready_window()
    set_server(window, True)
    qtbot.waitUntil(lambda: window.local_server.state is ServerState.STOPPED, timeout=WAIT_MS)
    assert "could not start" in window.server_label.text() and "no-such-tandem" in window.server_label.text()


def test_turning_the_switch_off_stops_the_child(ready_window, qtbot, port):
    window = ready_window()
    set_server(window, True, port)
    pid = wait_serving(qtbot, window, port)
    set_server(window, False, port)
    qtbot.waitUntil(lambda: window.local_server.state is ServerState.OFF, timeout=WAIT_MS)
    assert not is_running(pid) and not window.server_label.isVisible()
    assert not load_settings()[0].local_server.enabled


def test_closing_the_window_stops_the_child(ready_window, qtbot, port):
    window = ready_window()
    set_server(window, True, port)
    pid = wait_serving(qtbot, window, port)
    window.close()
    assert not is_running(pid)  # at once: closing waits for it


def test_a_new_active_pair_restarts_the_server_with_it(ready_window, qtbot, port):
    save_user_pairs([PairConfig("mine", ModelSpec("/models/mine"))])
    window = ready_window()
    window.pairs = all_pairs()
    set_server(window, True, port)
    first = wait_serving(qtbot, window, port)
    window.request_pair(window.pair_named("mine"))
    qtbot.waitUntil(lambda: window.local_server.pid() not in (None, first), timeout=WAIT_MS)
    second = wait_serving(qtbot, window, port)
    assert health(port)["model"] == "mine" and not is_running(first) and second != first


def test_a_pair_that_is_no_saved_one_is_given_as_a_json_file(ready_window, qtbot, port):
    window = ready_window()
    unsaved = PairConfig("command line", ModelSpec("/models/elsewhere"))
    window.request_pair(unsaved)
    qtbot.waitUntil(lambda: window.client.pair.config == unsaved, timeout=WAIT_MS)
    set_server(window, True, port)
    wait_serving(qtbot, window, port)
    given = Path(health(port)["model"])
    assert given.suffix == ".json" and PairConfig.from_dict(json.loads(given.read_text())) == unsaved


def test_the_reason_is_the_last_error_line():
    lines = ["INFO:     Started server process [1]", "ERROR:    Traceback's last words", "INFO:     Finished"]
    assert reason_from_output(lines, 1, 8080) == "Traceback's last words"
    assert reason_from_output(["tandem: unknown pair 'x'", "  "], 2, 8080) == "tandem: unknown pair 'x'"
    assert reason_from_output(["killed by the user"], 3, 8080) == "killed by the user"
    assert reason_from_output([], 3, 8080) == "it exited with code 3"
