"""Take the screenshots in docs/screenshots with the real engine and the demo pair.

    .venv/bin/python -m tests.app.screenshots

Runs in a private TANDEM_HOME (converted weights are shared with the user cache) on the
offscreen platform unless a display is set. The pair picker lists the converted demo folder,
which shares the demo's tokenizer, and a tiny random Llama with a character-level tokenizer
built here, which does not, so both kinds of draft entry show.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from tests.app.scratch_home import use_scratch_home

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
FIRST_QUESTION = "What is speculative decoding? Answer in two short paragraphs."
SECOND_QUESTION = "Write a Python function that reverses a string, then explain it in a short list."


def wait_until(app: QApplication, condition, timeout_s: float) -> None:
    """Run the event loop, idle between events, until `condition` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there in time")
        loop = QEventLoop()
        QTimer.singleShot(50, loop.quit)
        loop.exec()


def save(widget: QWidget, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    widget.grab().save(str(SHOTS / name))
    print("saved", SHOTS / name)


def tiny_character_model(folder: Path) -> Path:
    """A 2-layer random Llama whose tokenizer knows single characters only."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.engine.tiny_models import tiny_llama

    characters = "abcdefghijklmnopqrstuvwxyz ,.!?"
    vocabulary = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(characters)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tiny_llama(seed=0, vocab_size=len(vocabulary)).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def main() -> int:
    home = use_scratch_home("tandem-screenshots-")
    cache = home / "cache"

    from app.engine_api import LocalEngine
    from app.main_window import MainWindow
    from app.style import stylesheet

    app = QApplication(sys.argv[:1])
    app.setStyleSheet(stylesheet(app.palette()))
    window = MainWindow(LocalEngine())
    window.resize(1360, 860)
    window.show()
    try:
        take_screenshots(app, window, home, cache)
    finally:
        window.close()
    return 0


def take_screenshots(app: QApplication, window, home: Path, cache: Path) -> None:
    from engine.config import DecodeSettings

    wait_until(app, lambda: window.load_progress.isVisible(), 10)
    save(window, "first-start-loading.png")
    wait_until(app, lambda: window.client.pair is not None, 300)
    window.set_decoding(DecodeSettings(method="tree", max_new_tokens=200))

    window.pane.input.setPlainText(FIRST_QUESTION)
    window.pane.send_button.click()
    wait_until(app, lambda: not window.client.generating, 600)
    window.pane.input.setPlainText(SECOND_QUESTION)
    window.pane.send_button.click()
    wait_until(app, lambda: len(window.pane.view.messages[-1].text) > 150, 600)
    save(window, "main-window-mid-reply.png")
    wait_until(app, lambda: not window.client.generating, 600)

    window.pane.view.messages[1].figures_line.toggle.setChecked(True)
    window.set_show_provenance(True)
    app.processEvents()
    save(window, "main-window-provenance.png")
    window.set_show_provenance(False)

    dialog = window.open_settings()
    dialog.tabs.setCurrentIndex(1)
    dialog.decoding.temperature.setValue(0.7)
    wait_until(app, lambda: dialog.isVisible(), 5)
    save(dialog, "settings-decoding.png")
    dialog.tabs.setCurrentIndex(0)
    save(dialog, "settings-pairs.png")

    converted_demo = next((cache / "models").glob("SmolLM2-135M-Instruct.Q4_1-*"))
    window.settings.models = [str(converted_demo), str(tiny_character_model(home / "tiny-char-llama"))]
    dialog.settings.models = list(window.settings.models)
    picker = dialog.open_picker(None)
    wait_until(app, lambda: "checking" not in " ".join(str(r) for r in picker.reasons.values()), 120)
    picker.drafts.setCurrentRow(1)
    app.processEvents()
    save(picker, "pair-picker.png")
    picker.reject()
    dialog.reject()


if __name__ == "__main__":
    raise SystemExit(main())
