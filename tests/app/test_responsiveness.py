"""The GUI thread keeps serving events while a long reply streams (docs/GUI.md has the
figure measured with the real demo pair)."""
from __future__ import annotations

from tests.app.fake_engine import FakeEngine
from tests.app.helpers import send_and_wait
from tests.app.probe import EventLoopProbe

LONG_REPLY = " ".join(f"Word{i} and **bold {i}**, then `code {i}`." for i in range(120)) + "\n\n```python\n" + "\n".join(
    f"print({i})" for i in range(40)
) + "\n```"


def test_the_event_loop_stays_responsive_during_a_long_reply(ready_window, qtbot):
    window = ready_window(FakeEngine(reply=LONG_REPLY, token_delay_s=0.01))
    window.set_show_provenance(False)
    probe = EventLoopProbe()
    probe.start()
    send_and_wait(qtbot, window, "Write a lot", timeout=30_000)
    probe.stop()
    assert probe.ticks > 20
    # A GUI thread that waited on the engine would stall for the whole reply (over 2 s here);
    # the limit leaves room for a busy 2-core machine descheduling the process now and then.
    assert probe.worst_delay_s < 1.0, f"the GUI thread stalled for {probe.worst_delay_s * 1000:.0f} ms"
