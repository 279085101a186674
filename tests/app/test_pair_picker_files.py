"""The pair picker saves only pairs whose model files are whole: a truncated download is
refused with the engine's sentence, and the picker stays open to choose another."""
from __future__ import annotations

from PySide6.QtWidgets import QDialogButtonBox

from engine.pairs import load_user_pairs
from tests.app.test_settings_dialog import open_picker


def test_a_truncated_gguf_is_refused_when_the_pair_is_saved(ready_window, qtbot, tmp_path):
    broken = tmp_path / "half-downloaded.gguf"
    broken.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(8))  # a header cut after its first fields
    window = ready_window()
    picker = open_picker(window, qtbot, [str(broken)])
    picker.target.setCurrentIndex(picker.target.findData(str(broken)))
    picker.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert picker.isVisible()
    assert picker.status.text().startswith(f"This pair cannot be saved: {broken} is truncated")
    assert "Download or copy it again" in picker.status.text()
    assert load_user_pairs() == []
