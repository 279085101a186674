"""The settings dialog and the model pair picker."""
from __future__ import annotations

import json

from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QDialogButtonBox, QStyle

from app.pair_picker import SOURCE_ROLE, PairPicker
from app.settings import load_settings
from app.settings_dialog import DecodingForm
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.pairs import all_pairs, load_user_pairs, save_user_pairs, user_pairs_path
from tests.app.fake_engine import VERIFIERS, FakeEngine
from tests.app.helpers import send_and_wait

SMOL_360 = "/models/SmolLM2-360M-Instruct"
GEMMA = "/models/gemma-3-270m.gguf"


def test_knobs_that_would_do_nothing_are_disabled(qapp):
    form = DecodingForm(DecodeSettings(method="ar"), ("ar", "chain"), VERIFIERS)
    assert not form.draft_tokens.isEnabled() and not form.verifier.isEnabled()
    assert not form.top_p.isEnabled() and "greedy" in form.note.text()
    form.method.setCurrentIndex(form.method.findData("chain"))
    form.temperature.setValue(0.8)
    assert form.draft_tokens.isEnabled() and form.verifier.isEnabled() and form.top_p.isEnabled()
    assert form.note.text() == ""


def test_the_verifier_control_lists_what_the_pair_offers_approximate_ones_marked(qapp):
    offered = VERIFIERS + (("sprinter", "SPRINTER", False),)
    form = DecodingForm(DecodeSettings(temperature=0.7), ("ar", "chain"), offered)
    labels = [form.verifier.itemText(i) for i in range(form.verifier.count())]
    assert labels[:2] == ["Exact — block verification", "Exact — token-level"]
    assert labels[2].startswith("SPRINTER (approximate")


def test_decoding_changes_apply_to_the_next_reply_without_restart(ready_window, qtbot):
    engine = FakeEngine()
    window = ready_window(engine)
    dialog = window.open_settings()
    dialog.tabs.setCurrentIndex(1)
    dialog.decoding.temperature.setValue(0.9)  # the default is 0.7
    dialog.decoding.draft_tokens.setValue(6)
    dialog.decoding.verifier.setCurrentIndex(dialog.decoding.verifier.findData("token"))
    dialog.decoding.max_new_tokens.setValue(12)
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    finished = send_and_wait(qtbot, window, "Hi")
    settings = engine.requests[-1][1]
    assert (settings.temperature, settings.draft_tokens, settings.verifier, settings.max_new_tokens) == (0.9, 6, "token", 12)
    assert len(finished.token_ids) == 12 and finished.stop_reason == "length"
    assert load_settings()[0].decoding == settings


def test_the_pair_list_shows_every_summary_whole(ready_window, qtbot):
    far_away = "/home/someone/models/a/folder/that/is/quite/deep/Qwen2.5-7B-Instruct-Q4_K_M.gguf"
    save_user_pairs([PairConfig("qwen with a draft", ModelSpec(far_away), ModelSpec("/models/qwen-0.5b.gguf"))])
    window = ready_window()
    window.pairs = all_pairs()
    dialog = window.open_settings()
    qtbot.waitExposed(dialog)
    pair_list = dialog.pair_list
    margin = 2 * (pair_list.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, pair_list) + 1)
    metrics = pair_list.fontMetrics()
    for row in range(pair_list.count()):
        item = pair_list.item(row)
        shown = pair_list.visualItemRect(item)
        assert shown.right() <= pair_list.viewport().width()  # nothing beyond the right edge
        needed = metrics.boundingRect(
            QRect(0, 0, shown.width() - margin, 10_000), int(Qt.TextFlag.TextWrapAnywhere), item.text()
        )
        assert shown.height() >= needed.height()  # every wrapped line fits
    qwen = pair_list.findItems("qwen with a draft", Qt.MatchFlag.MatchStartsWith)[0]
    assert far_away in qwen.toolTip() and "/models/qwen-0.5b.gguf" in qwen.toolTip()


def open_picker(window, qtbot, models: list[str]) -> PairPicker:
    window.settings.models = models
    dialog = window.open_settings()
    picker = dialog.open_picker(None)
    qtbot.waitUntil(lambda: all("checking" not in r for r in picker.reasons.values() if r), timeout=5000)
    return picker


def draft_items(picker: PairPicker) -> dict[str, tuple[str, bool]]:
    items = (picker.drafts.item(row) for row in range(picker.drafts.count()))
    return {item.data(SOURCE_ROLE): (item.text(), bool(item.flags() & Qt.ItemFlag.ItemIsEnabled)) for item in items}


def test_the_pair_picker_offers_only_drafts_with_the_targets_tokenizer(ready_window, qtbot):
    engine = FakeEngine(tokenizer_families={GEMMA: "gemma"})
    window = ready_window(engine)
    picker = open_picker(window, qtbot, [SMOL_360, GEMMA])
    picker.target.setCurrentIndex(picker.target.findData(SMOL_360))
    qtbot.waitUntil(lambda: picker.reasons.get(GEMMA) not in (None, "checking its tokenizer…"), timeout=5000)
    items = draft_items(picker)
    assert items[""][1] and items["demo-target"][1]  # n-gram always fits; the demo shares SmolLM2's tokenizer
    text, enabled = items[GEMMA]
    assert not enabled and "different tokenizer" in text
    picker.drafts.setCurrentRow(list(items).index("demo-target"))
    picker.precision.setCurrentIndex(picker.precision.findData("int8"))
    assert picker.precision.itemText(0).startswith("auto: 8-bit (int8-wo on torch")
    picker.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    saved = load_user_pairs()
    assert [(p.target.source, p.target.precision, p.draft.source) for p in saved] == [(SMOL_360, "int8", "demo-target")]
    assert json.loads(user_pairs_path().read_text())["pairs"][0]["name"] == picker.name.text()
    assert window.pair_combo.findData(picker.name.text()) >= 0


def test_using_a_pair_from_settings_loads_it(ready_window, qtbot):
    window = ready_window()
    picker = open_picker(window, qtbot, [SMOL_360])
    picker.target.setCurrentIndex(picker.target.findData(SMOL_360))
    picker.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    dialog = window.settings_dialog
    dialog.pair_list.setCurrentRow(1)
    with qtbot.waitSignal(window.client.pair_loaded, timeout=5000):
        dialog.use_pair_button.click()
    assert window.client.pair.config.target.source == SMOL_360
    assert "[in use]" in dialog.pair_list.item(1).text()


def test_downloading_offline_says_so(ready_window, qtbot):
    window = ready_window(FakeEngine(online=False))
    picker = open_picker(window, qtbot, [])
    picker.repo_id.setText("HuggingFaceTB/SmolLM2-360M-Instruct")
    with qtbot.waitSignal(window.client.download_failed, timeout=5000):
        picker.download_button.click()
    assert "offline" in picker.status.text() and picker.download_button.isEnabled()


def test_a_downloaded_model_joins_the_lists_and_the_settings(ready_window, qtbot):
    window = ready_window(FakeEngine(online=True))
    picker = open_picker(window, qtbot, [])
    picker.repo_id.setText("HuggingFaceTB/SmolLM2-360M-Instruct")
    with qtbot.waitSignal(window.client.downloaded, timeout=5000):
        picker.download_button.click()
    assert picker.target.findData("HuggingFaceTB/SmolLM2-360M-Instruct") >= 0
    assert load_settings()[0].models == ["HuggingFaceTB/SmolLM2-360M-Instruct"]


def test_method_labels_say_what_a_method_is_not_which_is_fastest():
    # Which method is fastest depends on the machine and the pair: the speed panel and the bench measure it.
    from engine.methods import TABLE

    assert not any("fast" in f"{row.title} {row.summary}" for row in TABLE)


def test_sprinter_is_not_a_method_and_the_adaptive_chain_takes_no_k(qapp):
    form = DecodingForm(DecodeSettings(method="adaptive", temperature=0.7), ("ar", "chain", "adaptive", "sprinter"), VERIFIERS)
    methods = [form.method.itemData(i) for i in range(form.method.count())]
    assert methods == ["ar", "chain", "adaptive"]
    assert form.method.currentText().startswith("adaptive chain (SpecDec++)")
    assert not form.draft_tokens.isEnabled() and "chooses its draft length" in form.note.text()
    assert form.verifier.isEnabled()  # its chain is verified like any other


def test_the_pair_picker_keeps_the_compile_choice_and_what_it_does_not_show(ready_window, qtbot):
    """Editing a pair saves the compile checkbox, and keeps its EAGLE-3 head and n-gram settings."""
    from engine.config import ModelSpec, NgramSettings, PairConfig

    window = ready_window()
    window.settings.models = [SMOL_360]
    dialog = window.open_settings()
    edited = PairConfig("mine", ModelSpec(SMOL_360), None, NgramSettings(max_ngram=5), compile=False, eagle="/heads/eagle3")
    picker = dialog.open_picker(edited)
    assert not picker.compile.isChecked()
    assert picker.pair().compile is False
    assert picker.pair().eagle == "/heads/eagle3" and picker.pair().ngram == edited.ngram
    picker.compile.setChecked(True)
    assert picker.pair().compile is True
    picker.target.setCurrentIndex(picker.target.findData("demo-target"))
    assert picker.pair().eagle is None  # a head fits its own target only
    fresh = dialog.open_picker(None)
    assert fresh.compile.isChecked() and fresh.pair().eagle is None
