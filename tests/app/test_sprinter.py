"""The Verifier switch (Exact | SPRINTER), calibrating a pair's heads from Settings, and how
approximate replies are shown and kept (issue 11), over the fake engine."""
from __future__ import annotations

from PySide6.QtWidgets import QToolBar

from app.settings import load_settings
from app.storage import STOPPED
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.errors import OutOfMemoryError
from engine.pairs import save_user_pairs
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import last_reply, send, send_and_wait


def method_box(window) -> list[str]:
    return [window.method_combo.itemData(i) for i in range(window.method_combo.count())]


def choose_sprinter(window) -> None:
    window.verifier_switch.buttons["sprinter"].click()


def calibrate_in_settings(window, qtbot):
    """Open Settings → Model pairs and click Calibrate heads; return the heads panel."""
    dialog = window.open_settings()
    panel = dialog.heads_panel
    assert dialog.tabs.currentIndex() == 0 and panel.isVisible()
    panel.calibrate_button.click()
    return panel


def test_the_switch_is_on_the_toolbar_and_disabled_with_how_to_enable_it_until_the_pair_has_heads(ready_window):
    window = ready_window(FakeEngine())
    toolbar = window.findChild(QToolBar, "mainToolbar")
    switch = window.verifier_switch
    assert switch.isVisible() and switch.parent() is toolbar
    assert [b.text() for b in switch.buttons.values()] == ["Exact", "SPRINTER (approximate)"]
    assert not switch.isEnabled() and switch.mode == "exact"
    assert "Calibrate heads" in switch.toolTip() and "tandem calibrate --pair demo" in switch.toolTip()
    assert "Calibrate heads" in switch.buttons["sprinter"].toolTip()
    choose_sprinter(window)  # a disabled button does nothing
    assert window.settings.verifier_mode == "exact" and window.decode_settings().method == "auto"
    assert method_box(window) == ["auto", "ar", "chain"]


def test_a_pair_without_a_draft_model_says_sprinter_needs_one(make_window, qtbot):
    save_user_pairs([PairConfig("ngram only", ModelSpec("/models/target"))])
    window = make_window(FakeEngine(heads=True))
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        window.request_pair(window.pair_named("ngram only"))
    assert not window.verifier_switch.isEnabled()
    assert "needs a draft model" in window.verifier_switch.toolTip()
    panel = window.open_settings().heads_panel
    assert not panel.calibrate_button.isEnabled() and "n-grams" in panel.calibrate_button.toolTip()


def test_heads_that_cannot_be_used_are_named_in_the_tooltip(ready_window):
    problem = "The calibrated heads were trained on a draft of another width; run tandem calibrate again."
    window = ready_window(FakeEngine(heads_problem=problem))
    assert not window.verifier_switch.isEnabled()
    assert problem in window.verifier_switch.toolTip()


def test_calibrating_in_settings_shows_progress_then_enables_the_switch_and_the_figures(ready_window, qtbot):
    engine = FakeEngine(calibration_step_s=0.03)
    window = ready_window(engine)
    panel = calibrate_in_settings(window, qtbot)
    assert panel.progress.isVisible() and panel.cancel_button.isVisible() and not panel.calibrate_button.isVisible()
    shown: list[str] = []
    window.client.calibration_progress.connect(lambda *_: shown.append(panel.progress.format()))
    qtbot.waitUntil(lambda: bool(shown) and shown[-1].startswith("Target replies"), timeout=5000)
    assert "Calibrating the heads of “demo”" in window.load_label.text()
    assert not window.pane.send_button.isEnabled()  # replies wait for the engine thread
    with qtbot.waitSignal(window.client.calibrated, timeout=10000):
        pass
    assert "Target replies 8 / 8" in shown and shown[-1] == "Training heads 2 / 2"
    assert not panel.progress.isVisible() and panel.calibrate_button.text() == "Calibrate again"
    assert "Calibrated and saved" in panel.outcome.text()
    figures = panel.summary.text()
    assert "9.8%" in figures and "87%" in figures and "74%" in figures and "160 prompts" in figures
    assert window.verifier_switch.isEnabled()
    assert "sampled as replies are now: lets through 10%" in window.verifier_switch.buttons["sprinter"].toolTip()
    assert "right 81% of the time" in window.verifier_switch.buttons["sprinter"].toolTip()
    window.greedy_action.trigger()
    assert "greedy as replies are now: lets through 10%" in window.verifier_switch.buttons["sprinter"].toolTip()
    assert "right 87% of the time" in window.verifier_switch.buttons["sprinter"].toolTip()
    assert method_box(window) == ["auto", "ar", "chain", "adaptive"]
    assert window.method_combo.itemText(3) == "adaptive chain (SpecDec++)"
    assert window.load_label.text().startswith("Ready")
    assert window.pane.send_button.isEnabled()


def test_cancelling_a_calibration_leaves_everything_as_it_was(ready_window, qtbot):
    engine = FakeEngine(calibration_step_s=0.05)
    window = ready_window(engine)
    before = (window.client.pair, method_box(window), window.settings.verifier_mode)
    panel = calibrate_in_settings(window, qtbot)
    with qtbot.waitSignal(window.client.calibration_progress, timeout=5000):
        pass
    with qtbot.waitSignal(window.client.calibration_cancelled, timeout=5000):
        panel.cancel_button.click()
    assert (window.client.pair, method_box(window), window.settings.verifier_mode) == before
    assert engine.calibrations == 0
    assert not window.verifier_switch.isEnabled()
    assert "cancelled" in panel.outcome.text() and panel.calibrate_button.text() == "Calibrate heads"
    assert panel.calibrate_button.isVisible() and not panel.progress.isVisible()
    send_and_wait(qtbot, window, "Still here?")
    assert engine.requests[-1][1].method == "auto"


def test_a_failed_calibration_is_shown_and_the_app_keeps_running(ready_window, qtbot):
    engine = FakeEngine(calibration_error=OutOfMemoryError("The machine ran out of memory while calibrating."))
    window = ready_window(engine)
    panel = calibrate_in_settings(window, qtbot)
    with qtbot.waitSignal(window.client.calibration_failed, timeout=5000):
        pass
    assert "Calibration failed" in panel.outcome.text() and "ran out of memory" in panel.outcome.text()
    assert panel.outcome.objectName() == "formError"
    assert "Calibrating the heads failed" in window.pane.banner.text
    assert not window.verifier_switch.isEnabled()
    send_and_wait(qtbot, window, "Still works?")


def test_a_sprinter_reply_is_marked_approximate_on_screen_in_the_speed_panel_and_in_storage(make_window, qtbot):
    engine = FakeEngine(heads=True)
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    assert window.verifier_switch.isEnabled() and method_box(window) == ["auto", "ar", "chain", "adaptive"]
    choose_sprinter(window)
    assert window.verifier_switch.mode == "sprinter" and not window.method_combo.isEnabled()

    finished = send_and_wait(qtbot, window, "Fast, please")

    settings = engine.requests[-1][1]
    assert settings.method == "sprinter" and not finished.stats.exact
    reply = last_reply(window)
    assert reply.badge.isVisibleTo(reply) and reply.badge.text() == "approximate — SPRINTER"
    panel = window.speed_panel
    assert panel.values["verifier"].text() == "SPRINTER (approximate)"
    unchecked = finished.stats.unchecked_tokens
    assert unchecked > 0 and f"{unchecked} of {finished.stats.tokens_generated} tokens" in panel.values["unchecked"].text()
    assert panel.values["skipped"].text().startswith(f"{finished.stats.target_calls_skipped} ")
    assert finished.stats.target_calls_skipped > 0
    assert panel.values["quality"].text() == (  # sampled, at 0.7
        "lets through 10% of the tokens the target would reject; right 81% of the time "
        "(always guessing the commoner answer: 66%)"
    )
    assert panel.values["quality"].isVisibleTo(panel)
    saved = window.store.messages(window.controller.conversation_id)[-1]
    assert saved.verifier == "sprinter" and saved.figures["quality"]["false_positive_rate"] == 0.1
    assert "unchecked" in reply.figures_line.summary.text() and "SPRINTER (approximate)" in reply.figures_line.summary.text()

    window.provenance_action.trigger()
    assert "#f7c6d3" in reply.coloured.text()  # unchecked tokens on their own tint
    window.provenance_action.trigger()

    window.verifier_switch.buttons["exact"].click()
    finished = send_and_wait(qtbot, window, "Now exactly")
    assert engine.requests[-1][1].method == "auto" and finished.stats.exact
    assert not last_reply(window).badge.isVisibleTo(last_reply(window))
    assert panel.values["verifier"].text() == "Exact" and not panel.values["unchecked"].isVisibleTo(panel)
    window.close()

    again = make_window(engine)  # the mark is kept with the saved chat
    badges = [m.badge.isVisibleTo(m) for m in again.pane.view.messages if m.role == "assistant"]
    assert badges == [True, False]


def test_the_switch_is_kept_for_every_conversation_and_across_restarts(make_window, qtbot):
    engine = FakeEngine(heads=True)
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    choose_sprinter(window)
    assert load_settings()[0].verifier_mode == "sprinter"
    window.controller.new_conversation()
    send_and_wait(qtbot, window, "Another chat")
    assert engine.requests[-1][1].method == "sprinter"
    window.close()
    again = make_window(engine)
    qtbot.waitUntil(lambda: again.client.pair is not None, timeout=5000)
    assert again.verifier_switch.mode == "sprinter" and again.decode_settings().method == "sprinter"


def test_a_pair_without_heads_writes_exact_replies_whatever_the_saved_switch_says(make_window, qtbot):
    save_user_pairs([PairConfig("uncalibrated", ModelSpec("/models/target"), ModelSpec("/models/draft"))])
    engine = FakeEngine(heads=True)
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    choose_sprinter(window)
    engine.heads = False
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        window.request_pair(window.pair_named("uncalibrated"))
    assert not window.verifier_switch.isEnabled() and window.verifier_switch.mode == "exact"
    assert window.method_combo.isEnabled()
    send_and_wait(qtbot, window, "Exact here")
    assert engine.requests[-1][1].method == "auto"
    assert not last_reply(window).badge.isVisibleTo(last_reply(window))


def test_a_sprinter_reply_cut_short_by_closing_the_app_stays_marked(make_window, qtbot):
    engine = FakeEngine(heads=True, token_delay_s=0.05)
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    choose_sprinter(window)
    send(qtbot, window, "A long one")
    qtbot.waitUntil(lambda: len(last_reply(window).text) > 10, timeout=5000)
    window.close()
    again = make_window(engine)
    saved = again.store.messages(again.controller.conversation_id)[-1]
    assert saved.status == STOPPED and saved.figures is None and saved.approximate
    assert last_reply(again).badge.isVisibleTo(last_reply(again))


def exact_reply_cut_at_the_limit(make_window, qtbot):
    """A window whose pair has heads, holding one exact reply that stopped at a 3-token limit."""
    engine = FakeEngine(heads=True, reply="one two three four five six seven eight")
    window = make_window(engine)
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=3))
    send_and_wait(qtbot, window, "Count")
    return engine, window


def test_an_exact_reply_continued_by_sprinter_is_marked_approximate(make_window, qtbot):
    engine, window = exact_reply_cut_at_the_limit(make_window, qtbot)
    reply = last_reply(window)
    assert not reply.badge.isVisibleTo(reply)
    choose_sprinter(window)
    with qtbot.waitSignal(window.client.finished, timeout=5000):
        reply.continue_button.click()
    assert engine.requests[-1][1].method == "sprinter"
    assert reply.badge.isVisibleTo(reply) and reply.badge.text() == "approximate — SPRINTER"
    assert window.store.messages(window.controller.conversation_id)[-1].verifier == "sprinter"


def test_a_failed_sprinter_continue_leaves_an_exact_reply_exact(make_window, qtbot):
    engine, window = exact_reply_cut_at_the_limit(make_window, qtbot)
    choose_sprinter(window)
    engine.fail_after_tokens = 0
    reply = last_reply(window)
    with qtbot.waitSignal(window.client.errored, timeout=5000):
        reply.continue_button.click()
    saved = window.store.messages(window.controller.conversation_id)[-1]
    assert saved.verifier == "exact" and saved.content == "one two three"
    assert not reply.badge.isVisibleTo(reply)
