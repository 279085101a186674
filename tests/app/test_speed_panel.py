"""The speed panel explains every figure, its figures agree with each other, and nothing in it
is cut off in a small (1024×640) window, for exact and SPRINTER replies."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel

from app.figures import FIGURE_TIPS, calls_saved, detail_rows
from app.speed_panel import SpeedPanel, runtime_tip
from engine.config import DecodeSettings
from engine.drafters.auto import PLAIN, MethodChooser, SpeedRecord
from engine.drafters.base import NoDrafter
from engine.stats import GenerationStats
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import send_and_wait


def test_every_figure_has_a_one_sentence_tooltip_on_its_name_and_its_value(ready_window, qtbot):
    window = ready_window()
    panel = window.speed_panel
    for key, value in panel.values.items():
        tip = FIGURE_TIPS[key]
        assert value.toolTip() == tip and panel.names[key].toolTip() == tip
        assert tip.endswith(".") and tip.count(". ") <= 1  # a sentence or two, not an essay
    assert panel.share_bar.toolTip() == FIGURE_TIPS["time_share"] and panel.speed.toolTip() == FIGURE_TIPS["speed"]
    assert "tok/call" in FIGURE_TIPS["per_call"]


def test_the_runtime_shows_the_engines_forward_plan_and_tunes_choice_on_hover(qtbot):
    panel = SpeedPanel()
    qtbot.addWidget(panel)
    plan = "torch (native int8 forward): native C for every row count (why); precision int8-wo (the default on the CPU)"
    panel.set_pair({"runtime": "torch (native int8 forward)", "forward_plan": plan, "runtime_choice": "torch, chosen by tandem tune"})
    tip = panel.values["runtime"].toolTip()
    assert panel.values["runtime"].text() == "torch (native int8 forward)"
    assert tip.startswith(FIGURE_TIPS["runtime"]) and f"Forward plan: {plan}" in tip and "Chosen by measurement: torch" in tip
    assert runtime_tip({"runtime": "llama.cpp", "forward_plan": None}) == FIGURE_TIPS["runtime"]  # llama.cpp plans its own


def test_the_saving_the_calls_and_the_tokens_per_call_add_up_with_the_end_token():
    # 40 reply tokens and the end-of-reply token came from 12 target calls.
    stats = {"tokens_generated": 40, "stop_tokens": 1, "target_calls": 12, "target_calls_saved": 29,
             "mean_accepted_per_target_call": 41 / 12}
    assert calls_saved(stats) == "29 (12 target calls for 41 tokens with the end token)"
    rows = dict(detail_rows({"stats": stats, "decoding": {"method": "chain"}}))
    assert rows["Tokens per target call"] == "3.42"  # 41 / 12, as the saving counts


def test_sprinter_names_rounds_without_a_target_call_apart_from_calls_saved():
    stats = {"tokens_generated": 40, "unchecked_tokens": 30, "target_calls_skipped": 2, "target_calls": 8,
             "target_calls_saved": 32, "exact": False}
    rows = dict(detail_rows({"stats": stats, "decoding": {"method": "sprinter"}}))
    assert rows["Rounds without a target call"].startswith("2 (every token of the round passed the verifier)")
    assert rows["Target calls saved"].startswith("32 ")


def clipped_labels(window) -> list[str]:
    """Labels whose text needs more room than they got: a last line cut off, or cut at the right."""
    panel = window.speed_panel
    viewport = panel.widget().viewport()
    clipped = []
    for label in panel.findChildren(QLabel):
        if not label.isVisibleTo(panel) or not label.text():
            continue
        if label.wordWrap() and label.heightForWidth(label.width()) > label.height():
            clipped.append(f"{label.text()!r}: {label.height()} px high, needs {label.heightForWidth(label.width())}")
        right = label.mapTo(viewport, label.rect().topRight()).x()
        if right > viewport.width():
            clipped.append(f"{label.text()!r}: ends at {right} px, the panel shows {viewport.width()}")
    return clipped


@pytest.mark.parametrize("mode", ["exact", "sprinter"])
def test_nothing_is_cut_off_in_a_1024_by_640_window(make_window, qtbot, mode):
    window = make_window(FakeEngine(heads=True))
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=5000)
    window.resize(1024, 640)
    window.set_verifier_mode(mode)
    window.set_decoding(DecodeSettings(method="chain", temperature=0.7))
    send_and_wait(qtbot, window, "What is speculative decoding?")
    qtbot.wait(50)  # layouts settle
    assert window.speed_panel.values["verifier"].text() == ("Exact" if mode == "exact" else "SPRINTER (approximate)")
    assert clipped_labels(window) == []
    # The panel scrolls where the window is too short for all of it, instead of squeezing it.
    body = window.speed_panel.widget().widget()
    assert body.height() >= body.minimumSizeHint().height()
    # Every toolbar control is on the toolbar, none behind its overflow button.
    from PySide6.QtWidgets import QToolBar

    toolbar = window.findChild(QToolBar, "mainToolbar")
    hidden = [action.text() or type(toolbar.widgetForAction(action)).__name__ for action in toolbar.actions()
              if toolbar.widgetForAction(action) is not None and not toolbar.widgetForAction(action).isVisible()]
    assert hidden == []
    # And a reply's details wrap inside the chat instead of widening it past the window.
    reply = window.pane.view.messages[-1]
    reply.figures_line.toggle.setChecked(True)
    qtbot.wait(50)
    view = window.pane.view
    assert view.widget().width() <= view.viewport().width()


def test_a_background_compile_shows_while_it_runs_and_when_it_ends(ready_window, qtbot):
    """The pair chats while its forward compiles; the status line and the speed panel say so,
    and change when the compile ends (on a thread of its own), after the worker measured the
    tree costs again."""
    engine = FakeEngine(compile_s=2.0)
    window = ready_window(engine)
    runtime = window.speed_panel.values["runtime"]
    assert runtime.text() == "torch (static cache), compiling in the background"
    assert "compiling in the background" in window.load_label.text()
    qtbot.waitUntil(lambda: runtime.text() == "torch (static cache), compiled", timeout=10_000)
    assert "compiled" in window.load_label.text() and "compiling" not in window.load_label.text()
    assert window.client.worker._pair.remeasured == 1
    assert window.client.pair.description["runtime"].endswith("compiled")  # what About shows


def test_the_panel_says_what_autos_figure_compares_and_when_it_is_still_measuring(qtbot):
    panel = SpeedPanel()
    qtbot.addWidget(panel)
    auto = MethodChooser({PLAIN: NoDrafter(), "tree": NoDrafter()}, SpeedRecord())
    for _ in range(6):  # a trial of each: too few rounds of plain decoding for a figure
        auto.record.add(PLAIN, 0.010, 1)
        auto.record.add("tree", 0.012, 3)
    stats = GenerationStats(method="auto", tokens_generated=40, elapsed_s=2.0, note=auto.explain())
    panel.finish_reply(stats, {}, "eos")
    assert panel.caption.text().endswith("Auto: tree, the fastest measured here (against plain decoding: measuring…).")
    for _ in range(4):
        auto.record.add(PLAIN, 0.010, 1)
        auto.record.add("tree", 0.012, 3)
    stats.note = auto.explain()
    panel.finish_reply(stats, {}, "eos")
    assert panel.caption.text().endswith(
        "Auto: tree, 2.50× plain decoding's speed on this machine (median of 10 recent rounds of each).")


def test_live_figures_are_shown_at_most_twice_a_second_and_the_final_ones_at_once(qtbot):
    panel = SpeedPanel()
    qtbot.addWidget(panel)
    panel.start_reply(DecodeSettings(method="ar"), "Exact")
    description = {"device": "cpu", "precision": "bf16", "memory_mb": 800.0}

    def stats(tokens: int) -> GenerationStats:
        return GenerationStats(method="ar", tokens_generated=tokens, elapsed_s=tokens / 100, time_to_first_token_s=0.01)

    panel.show_live_stats(stats(10), description)
    assert panel.caption.text().startswith("10 tokens")  # the first figures at once
    panel.show_live_stats(stats(20), description)
    panel.show_live_stats(stats(30), description)
    assert panel.caption.text().startswith("10 tokens")  # later ones wait for the interval...
    qtbot.waitUntil(lambda: panel.caption.text().startswith("30 tokens"), timeout=2000)  # ...and the latest shows
    panel.show_live_stats(stats(40), description)
    panel.show_live_stats(stats(50), description)
    panel.finish_reply(stats(60), description, "eos")
    assert panel.caption.text().startswith("Last reply: 60 tokens")
    qtbot.wait(700)
    assert panel.caption.text().startswith("Last reply: 60 tokens")  # no live figure replaces the final ones
