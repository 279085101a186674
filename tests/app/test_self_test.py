"""TANDEM_SELF_TEST: the app sends the message as a user pressing Enter would, and reports
the window, the load and the reply it shows, one JSON line each."""
from __future__ import annotations

import io
import json

from app.self_test import SelfTest
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import last_reply


def test_the_self_test_sends_its_message_once_the_pair_loads_and_reports_the_shown_reply(make_window, qtbot):
    window = make_window(FakeEngine(reply="Paris is the capital.", load_delay_s=0.3))
    out = io.StringIO()
    SelfTest(window, "What is the capital of France?", out).start()  # before the pair has loaded
    with qtbot.waitSignal(window.client.finished, timeout=10_000):
        pass
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    names = [event["event"] for event in events]
    assert names[0] == "window-shown" and names[-2:] == ["pair-loaded", "reply"]
    assert set(names[1:-2]) == {"load-step"}
    seconds = [event["seconds"] for event in events]
    assert seconds == sorted(seconds) and seconds[0] > 0
    reply = events[-1]
    assert reply["text"] == "Paris is the capital." == last_reply(window).text
    assert reply["tokens"] == 4 and reply["stop_reason"] == "eos"
    question = window.pane.view.messages[-2]
    assert question.text == "What is the capital of France?" and window.pane.input.toPlainText() == ""
