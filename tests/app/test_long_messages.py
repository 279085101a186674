"""Long messages (issue 45, item 5): before one that would take long to read is sent, the
window says how long, from the prompt speed it measured on this machine; while one is read,
how far it got and how long is left; Stop works during the reading."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import Qt

from app.figures import duration, reading
from app.reading_time import ReadingClock, ReadingCost, fitted_cost, long_read_warning
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
    cost = window.controller.reading_costs.get("demo")
    assert cost is not None
    read_s = 4 * CHUNK_S
    assert 0.95 * read_s <= cost.seconds_to_read(4 * CHUNK_TOKENS) < 2 * read_s  # a sleep only oversleeps
    assert abs(cost.chars_per_token - 5) < 0.01

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
    cost = window.controller.reading_costs.get("demo")  # measured again: the fake reads every message
    earlier = sum(len(m.content) for m in window.store.messages(window.controller.conversation_id))
    assert estimate == cost.seconds_for(len(text), characters_before=earlier)  # after the chat its models hold
    assert estimate >= 0.95 * 4000 * CHUNK_S / CHUNK_TOKENS
    assert pane.long_read_notice.isVisible()
    assert pane.long_read_notice.text() == long_read_warning(estimate)
    # seconds, or minutes and seconds where the fake's sleeps overslept on a loaded machine (CI saw 1 min 50 s)
    assert re.search(r"about (\d+ min )?\d+ s on this machine", pane.long_read_notice.text())

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
    measured = window.controller.reading_costs.get("demo")
    window.close()
    again = ready_window(reading_engine())
    assert again.controller.reading_costs.get("demo") == measured
    assert again.controller.reading_costs.get("another pair") is None


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
    assert window.controller.reading_costs.get("demo") is None  # a reading cut short measures nothing

    engine.reading_chunks = 0
    send_and_wait(qtbot, window, "Shorter, then")
    history = engine.requests[-1][0]
    assert [m.content for m in history] == ["First question", FakeEngine().reply, long_text(300), "Shorter, then"]


def test_reading_clock_measures_the_speed_and_the_time_left():
    known = ReadingCost(seconds_per_token=0.01, seconds_per_token_seen=0.0, chars_per_token=4.0)
    clock = ReadingClock(known)
    clock.add(PromptProgress(0, 1000), 50.0)
    assert clock.cost() is None and clock.seconds_left() == 10.0  # from the cost known before
    for done, when in ((250, 50.5), (500, 51.0), (750, 51.5)):
        clock.add(PromptProgress(done, 1000), when)
    assert clock.cost() == (0.002, 0.0) and clock.seconds_left() == 0.5 and not clock.finished
    clock.add(PromptProgress(1000, 1000), 52.0)
    assert clock.finished and clock.seconds_left() == 0.0
    assert ReadingClock().seconds_left() is None
    assert ReadingCost(seconds_per_token=1 / 300, seconds_per_token_seen=0.0, chars_per_token=4.0).seconds_for(48_000) == 40.0


def test_a_reading_whose_tokens_slow_with_the_text_before_them_is_told_apart_from_a_steady_one():
    """Attention makes each token's read cost grow with the tokens before it: the demo target
    read 2,000 tokens at ~900 tokens/s and 7,000 at ~500. A cost fitted on one length must
    tell another, and the time left must count the slower chunks still to come."""
    per_token, per_seen = 0.001, 3e-7  # seconds; the second per token attended to (the demo target's ratio)

    def read(first: int, count: int, chunk: int = 256, before: int = 0) -> ReadingClock:
        clock, when = ReadingClock(), 0.0
        clock.add(PromptProgress(0, count, before), when)
        for start in range(first, count, chunk):
            tokens = min(chunk, count - start)
            when += tokens * (per_token + per_seen * (before + start + tokens / 2))
            clock.add(PromptProgress(start + tokens, count, before), when)
        return clock

    measured = read(0, 2000).cost()
    assert measured is not None
    assert abs(measured[0] - per_token) < 1e-9 and abs(measured[1] - per_seen) < 1e-12
    cost = ReadingCost(*measured, chars_per_token=4.0)
    truth = 7000 * (per_token + per_seen * 3500)
    assert abs(cost.seconds_to_read(7000) - truth) < 1e-6
    assert cost.seconds_to_read(7000) > 1.3 * 7000 * cost.seconds_to_read(2000) / 2000, "a linear speed would say less"
    assert abs(cost.seconds_to_read(1000, before=6000) - (truth - cost.seconds_to_read(6000))) < 1e-6

    halfway = ReadingClock()
    full = read(0, 7000)
    for event in full._events[: len(full._events) // 2]:  # the first half of a 7,000-token reading
        halfway.add(PromptProgress(event[1], 7000), event[0])
    elapsed = halfway._events[-1][0]
    assert abs(halfway.seconds_left() - (full._events[-1][0] - elapsed)) < 1e-6


def test_a_noisy_or_too_short_reading_falls_back_to_one_rate():
    assert fitted_cost([]) is None
    assert fitted_cost([(100, 0.5, 50), (100, 0.5, 150)]) == (0.005, 0.0)  # two chunks: one rate
    slower_first = [(100, 0.6, 50), (100, 0.5, 150), (100, 0.4, 250)]  # a reading that got faster
    assert fitted_cost(slower_first) == (0.005, 0.0)


def test_waits_are_said_as_a_person_would():
    assert [duration(s) for s in (0.2, 12.3, 59.5, 61, 130, 300, 327)] == [
        "1 s", "13 s", "1 min", "1 min", "2 min 10 s", "5 min", "5 min 30 s"
    ]
    assert reading(0.45, 12.0) == "Reading your message… 45% · about 12 s left"
    assert reading(1.0, 0.0) == reading(1.0) == "Reading your message… 100%"
    assert reading(0.3) == "Reading your message… 30%"

