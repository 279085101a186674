"""Long messages (issue 45, item 5): before one that would take long to read is sent, the
window says how long, from the prompt speed it measured on this machine; while one is read,
how far it got and how long is left; Stop works during the reading."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import Qt

from app.figures import duration, reading
from app.reading_time import ReadingClock, ReadingSpeed, long_read_warning
from app.storage import COMPLETE, STOPPED
from engine.events import PromptProgress
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import last_reply, send, send_and_wait

# 4 chunks of 10 prompt tokens, 0.05 s each: the fake reads prompts at about 200 tokens/s.
CHUNK_TOKENS, CHUNK_S = 10, 0.05


def reading_engine(**kwargs) -> FakeEngine:
    return FakeEngine(reading_chunks=4, reading_chunk_tokens=CHUNK_TOKENS, reading_chunk_s=CHUNK_S, **kwargs)


def long_text(word_count: int) -> str:
    return " ".join(["word"] * word_count)  # the fake tokenizer: one token a word, 5 characters each


def test_a_long_message_is_announced_once_the_pair_s_reading_speed_is_known(ready_window, qtbot):
    engine = reading_engine()
    window = ready_window(engine)
    pane = window.pane

    # 1. Nothing measured yet: a long message goes at once, and its reading is measured.
    send_and_wait(qtbot, window, long_text(2000))
    assert not pane.long_read_notice.isVisible()
    speed = window.controller.reading_speeds.get("demo")
    assert speed is not None
    assert 0.5 * CHUNK_TOKENS / CHUNK_S < speed.tokens_per_s <= 1.05 * CHUNK_TOKENS / CHUNK_S  # a sleep only oversleeps
    assert abs(speed.chars_per_token - 5) < 0.01

    # 2. A short message: no estimate, sent at once.
    send_and_wait(qtbot, window, "Thanks!")
    assert not pane.long_read_notice.isVisible()
    assert len(engine.requests) == 2

    # 3. A long one (4,000 tokens, 20 s or more at 200 tokens/s): said how long, not sent.
    text = long_text(4000)
    send(qtbot, window, text)
    qtbot.wait(50)
    assert len(engine.requests) == 2 and not window.client.generating
    assert pane.input.toPlainText() == text  # still there, to send or to edit
    estimate = window.controller.reading_estimate(text)
    assert abs(estimate - 4000 / speed.tokens_per_s) < 0.5
    assert pane.long_read_notice.isVisible()
    assert pane.long_read_notice.text() == long_read_warning(estimate)
    assert re.search(r"about \d+ s on this machine", pane.long_read_notice.text())

    # 4. Editing it takes the question back; sending the edited one asks again; Enter again sends.
    pane.input.setPlainText(text + " more")
    assert not pane.long_read_notice.isVisible()
    qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    assert pane.long_read_notice.isVisible() and len(engine.requests) == 2
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    assert len(engine.requests) == 3
    assert engine.requests[-1][0][-1].content == text + " more"
    assert not pane.long_read_notice.isVisible()


def test_the_speed_is_remembered_per_pair_across_a_restart(ready_window, qtbot):
    window = ready_window(reading_engine())
    send_and_wait(qtbot, window, long_text(2000))
    measured = window.controller.reading_speeds.get("demo")
    window.close()
    again = ready_window(reading_engine())
    assert again.controller.reading_speeds.get("demo") == measured
    assert again.controller.reading_speeds.get("another pair") is None


def test_reading_shows_how_long_is_left(ready_window, qtbot):
    window = ready_window(reading_engine())
    seen: list[tuple[str, str]] = []
    window.client.prompt_progress.connect(
        lambda *_: seen.append((last_reply(window).status.text(), window.speed_panel.caption.text()))
    )

    send_and_wait(qtbot, window, long_text(100))
    statuses = [status for status, _caption in seen]
    assert statuses[0] == "Reading your message… 0%"  # nothing measured yet: no time left to tell
    for status, fraction in zip(statuses[1:4], ("25%", "50%", "75%")):
        assert re.fullmatch(rf"Reading your message… {fraction} · about 1 s left", status)
    assert statuses[4] == "Reading your message… 100%"
    assert all(status == caption for status, caption in seen)  # the speed panel says the same

    # The second reading tells the time left from its start, with the speed measured by the first.
    seen.clear()
    send_and_wait(qtbot, window, long_text(100))
    assert seen[0][0] == "Reading your message… 0% · about 1 s left"


def test_stop_while_a_message_is_read_ends_the_reply_as_stopped_and_keeps_the_chat(ready_window, qtbot):
    engine = FakeEngine(reading_chunk_tokens=10, reading_chunk_s=0.05)
    window = ready_window(engine)
    send_and_wait(qtbot, window, "First question")  # no reading: the chat before the long one
    engine.reading_chunks = 200  # 10 s of reading
    send(qtbot, window, long_text(300))
    qtbot.waitUntil(lambda: "Reading your message" in last_reply(window).status.text(), timeout=5000)
    assert window.pane.stop_button.isVisible()

    asked = time.monotonic()
    with qtbot.waitSignal(window.client.finished, timeout=2000) as finished:
        window.pane.stop_button.click()
    assert time.monotonic() - asked < 1.0  # stopped between chunks, not after the 10 s of reading
    assert finished.args[1].stop_reason == "stopped" and finished.args[1].token_ids == ()

    messages = window.store.messages(window.controller.conversation_id)
    assert [(m.role, m.status) for m in messages][:3] == [("user", COMPLETE), ("assistant", COMPLETE), ("user", COMPLETE)]
    assert messages[0].content == "First question" and messages[2].content == long_text(300)
    assert messages[3].role == "assistant" and messages[3].status == STOPPED and messages[3].content == ""
    assert "stopped" in last_reply(window).status.text() and "Reading" not in last_reply(window).status.text()
    assert window.controller.reading_speeds.get("demo") is None  # a reading cut short measures nothing

    engine.reading_chunks = 0
    send_and_wait(qtbot, window, "Shorter, then")
    history = engine.requests[-1][0]
    assert [m.content for m in history] == ["First question", FakeEngine().reply, long_text(300), "Shorter, then"]


def test_reading_clock_measures_the_speed_and_the_time_left():
    clock = ReadingClock(known_tokens_per_s=100.0)
    clock.add(PromptProgress(0, 1000), 50.0)
    assert clock.tokens_per_s is None and clock.seconds_left() == 10.0  # from the speed known before
    clock.add(PromptProgress(500, 1000), 52.0)
    assert clock.tokens_per_s == 250.0 and clock.seconds_left() == 2.0 and not clock.finished
    clock.add(PromptProgress(1000, 1000), 54.0)
    assert clock.finished and clock.seconds_left() == 0.0
    assert ReadingClock().seconds_left() is None
    assert ReadingSpeed(tokens_per_s=300.0, chars_per_token=4.0).seconds_for(48_000) == 40.0


def test_waits_are_said_as_a_person_would():
    assert [duration(s) for s in (0.2, 12.3, 59.5, 61, 130, 300, 327)] == [
        "1 s", "13 s", "1 min", "1 min", "2 min 10 s", "5 min", "5 min 30 s"
    ]
    assert reading(0.45, 12.0) == "Reading your message… 45% · about 12 s left"
    assert reading(1.0, 0.0) == reading(1.0) == "Reading your message… 100%"
    assert reading(0.3) == "Reading your message… 30%"

