"""SIGTERM and Ctrl-C close the window as its close button does: the engine thread is
stopped and joined, and the reply being written is kept, marked as stopped."""
from __future__ import annotations

import os
import signal

import pytest

from app.storage import STOPPED, open_chat_store
from app.termination import CloseOnTermination
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import last_reply, send


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_termination_signal_closes_the_window_mid_reply_and_stops_the_engine(ready_window, qtbot, number):
    handler_before = signal.getsignal(number)
    window = ready_window(FakeEngine(token_delay_s=0.05))
    termination = CloseOnTermination(window)
    try:
        send(qtbot, window, "Tell me something long.")
        qtbot.waitUntil(lambda: len(last_reply(window).text) > 10, timeout=5000)
        os.kill(os.getpid(), number)
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
    finally:
        termination.restore()
    assert window.client._thread.isFinished()
    store, _warning = open_chat_store()
    reply = store.messages(store.list_conversations()[0].id)[-1]
    store.close()
    assert reply.role == "assistant" and reply.status == STOPPED
    assert reply.content and reply.note == "the app was closed during this reply"
    assert signal.getsignal(number) is handler_before
