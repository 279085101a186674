"""Take the screenshots in docs/screenshots with the real engine and the demo pair.

    .venv/bin/python -m tests.app.screenshots                        # all of them
    .venv/bin/python -m tests.app.screenshots long-chat recovery     # only these sets

Sets: `tour` (the main window, settings and pair picker), `long-chat` (the newest reply in
view after a 40,000-character message), `recovery` (a corrupt chats file set aside),
`rough-edges` (issue 13: the Greedy toggle, long pair names, reading a long message over the
fake engine, and a first start converting the demo model for torch, with the real engine),
`sprinter` (issue 11, the real engine: the Verifier switch before and after calibrating the
demo pair's heads in Settings, the calibration's progress, and a SPRINTER reply with its
speed panel and its unchecked tokens), `everyday` (issue 23, over the fake engine: the menus,
About, export, the token-limit notice, a pair that failed to load, the dark theme, 1024×640),
`compile` (issue 21, over the fake engine: a torch pair compiling in the background, then
compiled, and the pair picker's compile setting), `found-models` (issue 48, over the fake
engine: the pair picker listing models found in fake LM Studio, Ollama, Hugging Face, GPT4All
and Jan folders, a found target's drafts, EAGLE-3 head and methods, and its GGUF run as stored), `long-message` (issue
45, over the fake engine: a long message's reading time said before it is sent, and the time
left while it is read), `long-message-real` (issue 45, the real engine: the same for a
~7,000-token message after a ~2,000-token one measured the reading cost), `local-server` (issue 48, over the fake engine and a stand-in server:
Settings → Local server switched on, and the status bar serving, then stopped on a taken port).

Runs in a private TANDEM_HOME (converted weights are shared with the user cache) on the
offscreen platform unless a display is set. The pair picker lists the converted demo folder,
which shares the demo's tokenizer, and a tiny random Llama with a character-level tokenizer
built here, which does not, so both kinds of draft entry show.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QPoint, QTimer
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import QApplication, QToolTip, QWidget

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


def main(argv: list[str] | None = None) -> int:
    chosen = (sys.argv[1:] if argv is None else argv) or list(SETS)
    unknown = [name for name in chosen if name not in SETS]
    if unknown:
        print(f"unknown screenshot sets {unknown}; choose from {list(SETS)}", file=sys.stderr)
        return 2
    from app.style import stylesheet

    app = QApplication(sys.argv[:1])
    app.setStyleSheet(stylesheet(app.palette()))
    for name in chosen:
        home = use_scratch_home(f"tandem-screenshots-{name}-")  # each set starts from a fresh home
        SETS[name](app, home)
    return 0


def open_window(app: QApplication):
    from app.engine_api import LocalEngine
    from app.main_window import MainWindow

    window = MainWindow(LocalEngine())
    window.resize(1360, 860)
    window.show()
    return window


def tour(app: QApplication, home: Path) -> None:
    window = open_window(app)
    try:
        take_screenshots(app, window, home, home / "cache")
    finally:
        window.close()


def long_chat(app: QApplication, home: Path) -> None:
    """A conversation whose earlier reply is about 40,000 characters long, then a new
    question: the new reply streams in view at the bottom (issue 13)."""
    from app.storage import open_chat_store
    from engine.config import DecodeSettings

    store, _warning = open_chat_store()
    conversation = store.create_conversation("A very long answer")
    store.add_message(conversation.id, "user", "List the numbers from 1 to 5000 in words, one per line.")
    long_reply = "\n\n".join(f"Paragraph {n}: " + "all the numbers so far, " * 12 for n in range(1, 140))
    store.add_message(conversation.id, "assistant", long_reply)
    store.close()
    window = open_window(app)
    try:
        wait_until(app, lambda: window.client.pair is not None, 300)
        window.set_decoding(DecodeSettings(method="tree", max_new_tokens=60))
        window.pane.input.setPlainText("Thanks. Now in one sentence: what is speculative decoding?")
        window.pane.send_button.click()
        wait_until(app, lambda: not window.client.generating and len(window.pane.view.messages) == 4, 600)
        app.processEvents()
        save(window, "chat-after-long-message.png")
    finally:
        window.close()


def recovery(app: QApplication, home: Path) -> None:
    """The chats file is random bytes: it is set aside and the app says where (issue 13)."""
    chats = home / "data" / "chats.sqlite3"
    chats.parent.mkdir(parents=True, exist_ok=True)
    chats.write_bytes(os.urandom(64 * 1024))
    window = open_window(app)
    try:
        wait_until(app, lambda: window.client.pair is not None, 300)
        save(window, "corrupt-chats-recovered.png")
    finally:
        window.close()


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


def rough_edges(app: QApplication, home: Path) -> None:
    """Issue 13's rough edges, fixed: the fake engine for the window's own behaviour, the real
    one for the first start's loading line."""
    from app.main_window import MainWindow
    from engine.config import ModelSpec, PairConfig
    from engine.pairs import save_user_pairs
    from tests.app.fake_engine import FakeEngine

    models = "/home/someone/models"
    save_user_pairs([
        PairConfig("qwen2.5-7b-instruct + 0.5b draft", ModelSpec(f"{models}/Qwen2.5-7B-Instruct-Q4_K_M.gguf"),
                   ModelSpec(f"{models}/Qwen2.5-0.5B-Instruct-Q8_0.gguf")),
        PairConfig("llama 3.1 8b, n-gram drafts", ModelSpec(f"{models}/Meta-Llama-3.1-8B-Instruct")),
    ])
    engine = FakeEngine(token_delay_s=0.4, reading_chunks=12)
    window = MainWindow(engine)
    window.resize(1200, 720)
    window.show()
    try:
        wait_until(app, lambda: window.client.pair is not None, 10)
        window.request_pair(window.pair_named("qwen2.5-7b-instruct + 0.5b draft"))
        wait_until(app, lambda: window.client.loading is None and window.client.pair.config.name.startswith("qwen"), 10)
        window.greedy_action.trigger()
        app.processEvents()
        save(window.findChild(QWidget, "mainToolbar"), "toolbar-greedy-and-pair-name.png")
        window.greedy_action.trigger()

        dialog = window.open_settings()
        wait_until(app, lambda: dialog.isVisible(), 5)
        save(dialog, "settings-pair-list-wrapped.png")
        dialog.tabs.setCurrentIndex(1)
        dialog.decoding.temperature.setValue(0.0)
        app.processEvents()
        save(dialog, "settings-decoding-greedy.png")
        dialog.reject()

        window.pane.input.setPlainText("Summarise this report: " + "lorem ipsum dolor sit amet " * 40)
        window.pane.send_button.click()
        wait_until(app, lambda: "42%" in window.speed_panel.caption.text(), 20)
        save(window, "reading-a-long-message.png")
        wait_until(app, lambda: not window.client.generating, 120)
    finally:
        window.close()
    first_start(app)


def seconds_shown(window) -> int:
    """The seconds the loading line counts for its step (a busy engine thread may skip one)."""
    return int(window.load_label.text().rsplit(" ", 2)[-2])


def first_start(app: QApplication) -> None:
    """A first start of a base install (no llama.cpp): the demo model is converted for torch."""
    import tempfile

    from engine.runtime import llamacpp_library

    os.environ["TANDEM_HOME"] = tempfile.mkdtemp(prefix="tandem-screenshots-first-start-")  # no converted weights
    llamacpp_library.available = lambda: False
    window = open_window(app)
    window.resize(1200, 720)
    try:
        wait_until(app, lambda: window.load_label.text().startswith("Converting") and seconds_shown(window) >= 2, 120)
        save(window, "first-start-converting.png")
        wait_until(app, lambda: window.client.pair is not None, 300)
        save(window.statusBar(), "first-start-ready.png")
    finally:
        window.close()


def with_tooltip(app: QApplication, widget: QWidget, under: QWidget, name: str) -> None:
    """Save `widget` with the tooltip of `under` (a child of it) shown below it, as on hover."""
    QToolTip.showText(under.mapToGlobal(QPoint(0, under.height())), under.toolTip(), under)
    wait_until(app, lambda: any(w.inherits("QTipLabel") and w.isVisible() for w in app.topLevelWidgets()), 5)
    tip = next(w for w in app.topLevelWidgets() if w.inherits("QTipLabel") and w.isVisible())
    shot, tip_shot = widget.grab(), tip.grab()
    left = min(under.mapTo(widget, QPoint(0, 0)).x(), max(shot.width() - tip_shot.width(), 0))
    combined = QPixmap(max(shot.width(), left + tip_shot.width()), shot.height() + tip_shot.height() + 2)
    combined.fill(widget.palette().window().color())
    painter = QPainter(combined)
    painter.drawPixmap(0, 0, shot)
    painter.drawPixmap(left, shot.height() + 2, tip_shot)
    painter.end()
    QToolTip.hideText()
    SHOTS.mkdir(parents=True, exist_ok=True)
    combined.save(str(SHOTS / name))
    print("saved", SHOTS / name)


# A smaller calibration than `tandem calibrate`'s 160 prompts of up to 128 tokens, so that the
# set runs in minutes on a CPU; the Settings screenshot says what the heads were trained on.
SCREENSHOT_CALIBRATION = {"prompts": 40, "max_new_tokens": 64}


def sprinter(app: QApplication, home: Path) -> None:
    """Issue 11 with the real engine: the Verifier switch disabled until the demo pair's heads
    are calibrated (in Settings, with progress), then a SPRINTER reply."""
    from app.engine_api import LocalEngine
    from app.main_window import MainWindow
    from engine.tools.calibrate.calibrate import CalibrationSettings

    window = MainWindow(LocalEngine(CalibrationSettings(**SCREENSHOT_CALIBRATION)))
    window.resize(1360, 860)
    window.show()
    try:
        wait_until(app, lambda: window.client.pair is not None, 300)
        toolbar = window.findChild(QWidget, "mainToolbar")
        with_tooltip(app, toolbar, window.verifier_switch, "verifier-switch-uncalibrated.png")

        dialog = window.open_settings()
        wait_until(app, lambda: dialog.isVisible(), 5)
        dialog.heads_panel.calibrate_button.click()
        wait_until(app, lambda: (window.client.calibration_step or ("", 0, 0))[1] >= 12, 900)
        save(dialog, "calibrate-heads-progress.png")
        wait_until(app, lambda: not window.client.calibrating, 1800)
        app.processEvents()
        save(dialog, "calibrate-heads-done.png")
        dialog.reject()

        window.verifier_switch.buttons["sprinter"].click()
        window.set_decoding(window.settings.decoding.with_changes(max_new_tokens=160))
        app.processEvents()
        with_tooltip(app, toolbar, window.verifier_switch.buttons["sprinter"], "verifier-switch-sprinter.png")
        window.pane.input.setPlainText(FIRST_QUESTION)
        window.pane.send_button.click()
        wait_until(app, lambda: not window.client.generating and len(window.pane.view.messages) == 2, 600)
        window.pane.view.messages[1].figures_line.toggle.setChecked(True)
        app.processEvents()
        save(window, "sprinter-reply-speed-panel.png")
        window.set_show_provenance(True)
        app.processEvents()
        save(window, "sprinter-reply-provenance.png")
    finally:
        window.close()


def with_popup(app: QApplication, window: QWidget, popup: QWidget, name: str) -> None:
    """Save `window` with an open popup (a menu, a combo box's list) drawn where it shows:
    popups are windows of their own, which grabbing the main window leaves out."""
    wait_until(app, popup.isVisible, 5)
    app.processEvents()
    shot, popup_shot = window.grab(), popup.grab()
    at = popup.mapToGlobal(QPoint(0, 0)) - window.mapToGlobal(QPoint(0, 0))
    combined = QPixmap(max(shot.width(), at.x() + popup_shot.width()), max(shot.height(), at.y() + popup_shot.height()))
    combined.fill(window.palette().window().color())
    painter = QPainter(combined)
    painter.drawPixmap(0, 0, shot)
    painter.drawPixmap(at, popup_shot)
    painter.end()
    SHOTS.mkdir(parents=True, exist_ok=True)
    combined.save(str(SHOTS / name))
    print("saved", SHOTS / name)


def fake_window(app: QApplication, engine, width: int = 1200, height: int = 760):
    from app.main_window import MainWindow

    window = MainWindow(engine)
    window.resize(width, height)
    window.show()
    wait_until(app, lambda: window.client.pair is not None and window.client.loading is None, 10)
    return window


def send_and_finish(app: QApplication, window, text: str) -> None:
    window.pane.input.setPlainText(text)
    window.pane.send_button.click()
    wait_until(app, lambda: not window.client.generating and window.controller.stream is None, 60)
    app.processEvents()


def everyday(app: QApplication, home: Path) -> None:
    """Issue 23, over the fake engine (the window's own behaviour is the point): the menu bar
    and About, an export and a refused one, the token-limit notice, a pair that failed to
    load, the dark theme, and the window at 1024×640 with exact and SPRINTER replies."""
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    from app.theme import apply_theme
    from engine.config import DecodeSettings, ModelSpec, PairConfig
    from engine.errors import ModelLoadError
    from engine.pairs import save_user_pairs
    from tests.app.fake_engine import FakeEngine

    save_user_pairs([PairConfig("qwen2.5-7b + 0.5b draft", ModelSpec("/home/someone/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"),
                                ModelSpec("/home/someone/models/Qwen2.5-0.5B-Instruct-Q8_0.gguf"))])
    missing = ModelLoadError("Model file not found: /home/someone/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf")
    engine = FakeEngine(token_delay_s=0.02, heads=True,
                        failing_sources={"/home/someone/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf": missing})
    window = fake_window(app, engine)
    try:
        send_and_finish(app, window, "What is speculative decoding?")
        file_menu = window.menuBar().actions()[0].menu()
        file_menu.popup(window.menuBar().mapToGlobal(QPoint(0, window.menuBar().height())))
        with_popup(app, window, file_menu, "menu-file.png")
        file_menu.close()
        view_menu = window.menuBar().actions()[1].menu()
        view_menu.popup(window.menuBar().mapToGlobal(QPoint(40, window.menuBar().height())))
        wait_until(app, view_menu.isVisible, 5)
        theme_menu = view_menu.actions()[0].menu()
        view_menu.setActiveAction(view_menu.actions()[0])
        theme_menu.popup(view_menu.mapToGlobal(QPoint(view_menu.width(), 0)))
        wait_until(app, theme_menu.isVisible, 5)
        shot_menus(app, window, [view_menu, theme_menu], "menu-view-theme.png")
        theme_menu.close()
        view_menu.close()

        about = window.open_about()
        wait_until(app, about.isVisible, 5)
        save(about, "about-dialog.png")
        about.reject()

        exported = home / "exports" / "What-is-speculative-decoding.md"
        exported.parent.mkdir()
        QFileDialog.getSaveFileName = lambda *args, **kwargs: (str(exported), "Markdown (*.md)")
        window.export_chat_action.trigger()
        app.processEvents()
        save(window, "export-chat-done.png")
        refused = []

        def show_warning(parent, title, text):
            box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
            box.show()
            refused.append(box)

        QMessageBox.warning = show_warning
        QFileDialog.getSaveFileName = lambda *args, **kwargs: ("/sys/owls.md", "")  # refused even to root
        window.export_chat_action.trigger()
        wait_until(app, refused[0].isVisible, 5)
        save(refused[0], "export-chat-refused.png")
        refused[0].close()

        window.set_decoding(window.settings.decoding.with_changes(max_new_tokens=24))
        send_and_finish(app, window, "And in more detail?")
        save(window, "token-limit-notice.png")
        window.pane.view.messages[-1].continue_button.click()  # carry on the cut reply
        wait_until(app, lambda: window.controller.stream is None, 30)
        save(window, "token-limit-continued.png")

        window.request_pair(window.pair_named("qwen2.5-7b + 0.5b draft"))
        wait_until(app, lambda: window.client.loading is None and window.pane.banner.isVisible(), 10)
        window.pair_combo.showPopup()
        with_popup(app, window, window.pair_combo.view().window(), "pair-failed-to-load.png")
        window.pair_combo.hidePopup()
        window.pane.banner.hide()

        window.set_theme("dark")
        window.set_show_provenance(True)
        app.processEvents()
        save(window, "dark-theme.png")
        window.set_show_provenance(False)
        window.set_theme("system")
    finally:
        window.close()
    apply_theme("system")

    for mode in ("exact", "sprinter"):
        use_scratch_home(f"tandem-screenshots-everyday-{mode}-")
        small = fake_window(app, FakeEngine(token_delay_s=0.02, heads=True), 1024, 640)
        try:
            small.set_verifier_mode(mode)
            small.set_decoding(DecodeSettings(method="chain", max_new_tokens=200, temperature=0.7))
            send_and_finish(app, small, "What is speculative decoding?")
            small.pane.view.messages[-1].figures_line.toggle.setChecked(True)
            app.processEvents()
            save(small, f"window-1024x640-{mode}.png")
        finally:
            small.close()


def shot_menus(app: QApplication, window: QWidget, menus: list[QWidget], name: str) -> None:
    """Like `with_popup`, for a menu and its open submenu."""
    app.processEvents()
    shot = window.grab()
    origin = window.mapToGlobal(QPoint(0, 0))
    placed = [(menu.mapToGlobal(QPoint(0, 0)) - origin, menu.grab()) for menu in menus]
    width = max([shot.width()] + [at.x() + pixmap.width() for at, pixmap in placed])
    height = max([shot.height()] + [at.y() + pixmap.height() for at, pixmap in placed])
    combined = QPixmap(width, height)
    combined.fill(window.palette().window().color())
    painter = QPainter(combined)
    painter.drawPixmap(0, 0, shot)
    for at, pixmap in placed:
        painter.drawPixmap(at, pixmap)
    painter.end()
    combined.save(str(SHOTS / name))
    print("saved", SHOTS / name)


def compile_in_background(app: QApplication, home: Path) -> None:
    """Issue 21, over the fake engine: a torch pair chatting while its forward compiles in the
    background, the window once the compile has ended, and the pair picker's setting."""
    from tests.app.fake_engine import FakeEngine

    window = fake_window(app, FakeEngine(token_delay_s=0.02, compile_s=6.0))
    try:
        send_and_finish(app, window, "What is speculative decoding?")
        save(window, "compiling-in-the-background.png")
        wait_until(app, lambda: "compiled" in window.speed_panel.values["runtime"].text().split(", ")[-1], 20)
        save(window, "compiled.png")
        picker = window.open_settings().open_picker(None)
        wait_until(app, picker.isVisible, 5)
        save(picker, "pair-picker-compile.png")
        picker.reject()
    finally:
        window.close()


def found_models(app: QApplication, home: Path) -> None:
    """Issue 48, over the fake engine: the pair picker listing the models found on a machine
    laid out as LM Studio, Ollama, the Hugging Face cache, GPT4All and Jan lay theirs out (tiny
    GGUF files, hence their sizes; one Ollama model whose file is gone), then a found target
    with its found drafts, its EAGLE-3 head and the methods the pair gets."""
    from tests.app.fake_engine import FakeEngine
    from tests.engine.discovery.fake_machine import furnished_home

    machine = home / "machine"
    paths = furnished_home(machine)
    os.environ["TANDEM_SEARCH_HOME"] = str(machine)
    window = fake_window(app, FakeEngine())
    try:
        picker = window.open_settings().open_picker(None)
        wait_until(app, lambda: picker.found is not None and picker.isVisible(), 10)
        save(picker, "pair-picker-found-models.png")
        picker.target.setCurrentIndex(picker.target.findData(str(paths["target"])))
        wait_until(app, lambda: "checking" not in " ".join(str(r) for r in picker.reasons.values()), 10)
        picker.drafts.setCurrentRow(1)
        app.processEvents()
        save(picker, "pair-picker-found-drafts.png")
        # a found GGUF target run as its file holds it (issue 47: a Q4_K_M file stays Q4_K_M)
        picker.precision.setCurrentIndex(picker.precision.findData("stored"))
        picker.runtime.setCurrentIndex(picker.runtime.findData("llama.cpp"))
        app.processEvents()
        save(picker, "pair-picker-stored-precision.png")
        picker.reject()
    finally:
        window.close()


def long_message(app: QApplication, home: Path) -> None:
    """Issue 45, over the fake engine reading prompts at about 300 tokens/s: a 30,000-character
    message announced with its reading time before it is sent, then its reading with the time left."""
    from tests.app.fake_engine import FakeEngine

    engine = FakeEngine(token_delay_s=0.02, reading_chunks=4, reading_chunk_tokens=30, reading_chunk_s=0.1)
    window = fake_window(app, engine)
    try:
        send_and_finish(app, window, "Summarise this report: " + "lorem ipsum dolor sit amet " * 40)  # measures the speed
        report = "Summarise this report: " + "the quarterly figures rose again in every region " * 620
        window.pane.input.setPlainText(report)
        window.pane.send_button.click()
        wait_until(app, window.pane.long_read_notice.isVisible, 5)
        save(window, "long-message-estimate.png")
        engine.reading_chunks = 40
        window.pane.send_button.click()
        wait_until(app, lambda: "left" in window.speed_panel.caption.text() and "30%" in window.speed_panel.caption.text(), 20)
        save(window, "long-message-reading-time-left.png")
        wait_until(app, lambda: not window.client.generating, 60)
    finally:
        window.close()


def reading_percent(window) -> int:
    """How far the speed panel says a message's reading got (0 before it says)."""
    found = re.search(r"(\d+)%", window.speed_panel.caption.text())
    return int(found.group(1)) if found else 0


def long_message_real(app: QApplication, home: Path) -> None:
    """Issue 45 with the real engine and the app's defaults: a message of ~2,000 tokens read
    first (it measures the pair's reading cost), then one of ~7,000 tokens in a new chat,
    announced with its reading time before it is sent and then read with the time left.
    Prints the estimate beside the seconds the first text took to come."""
    from app.reading_time import LONG_READ_S
    from engine.config import DecodeSettings

    # this project's benchmarks page as prose, ~2.1 characters a token at its start
    page = (Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    benchmarks = " ".join(re.sub(r"[|#*`]", " ", page).split())
    window = open_window(app)
    try:
        wait_until(app, lambda: window.client.pair is not None, 300)
        window.set_decoding(DecodeSettings(method="auto", temperature=0.7, max_new_tokens=16))
        window.pane.input.setPlainText("Summarize this text in two sentences: " + benchmarks[:4_300])
        window.pane.send_button.click()
        wait_until(app, lambda: not window.client.generating and len(window.pane.view.messages) == 2, 300)
        window.controller.new_conversation()
        window.pane.input.setPlainText("Summarize this text in two sentences: " + benchmarks[:14_800])
        estimate = window.controller.reading_estimate(window.pane.input.toPlainText())
        first_text: list[float] = []
        window.client.text_delta.connect(lambda *_: first_text.append(time.monotonic()) if not first_text else None)
        announced = estimate is not None and estimate > LONG_READ_S
        if announced:  # the first Send only announces the reading time
            window.pane.send_button.click()
            wait_until(app, window.pane.long_read_notice.isVisible, 10)
            save(window, "long-message-estimate-real-engine.png")
        sent = time.monotonic()
        window.pane.send_button.click()
        if announced:
            wait_until(app, lambda: "left" in window.speed_panel.caption.text() and reading_percent(window) >= 50, 120)
            save(window, "long-message-reading-real-engine.png")
        wait_until(app, lambda: not window.client.generating, 300)
        said = "announced" if announced else f"not announced: under the {LONG_READ_S:.0f} s a message is announced from"
        print(f"estimated {estimate:.1f} s before sending ({said}); the first text came after {first_text[0] - sent:.1f} s")
    finally:
        window.close()


def local_server_shots(app: QApplication, home: Path) -> None:
    """Issue 48, over the fake engine, with tests/app/fake_server.py standing in for `tandem serve`
    (it answers /health on 127.0.0.1 as the real one does, without a model)."""
    import socket

    from PySide6.QtWidgets import QDialogButtonBox

    from app import local_server
    from app.local_server import ServerState
    from tests.app.fake_engine import FakeEngine

    local_server.serve_command_prefix = lambda: [sys.executable, str(Path(__file__).with_name("fake_server.py"))]
    window = fake_window(app, FakeEngine())
    try:
        dialog = window.open_settings()
        form = dialog.server_form
        dialog.tabs.setCurrentWidget(form)
        form.enabled.setChecked(True)
        form.api_key.setText("s3cret")
        wait_until(app, dialog.isVisible, 5)
        save(dialog, "settings-local-server.png")
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
        wait_until(app, lambda: window.local_server.state is ServerState.SERVING, 15)
        save(window.statusBar(), "status-bar-local-server-serving.png")
        save(window, "local-server-serving.png")
        with socket.socket() as taken:  # another program on the port
            taken.bind(("127.0.0.1", 8181))
            taken.listen()
            dialog = window.open_settings()
            dialog.server_form.port.setValue(8181)
            dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
            wait_until(app, lambda: window.local_server.state is ServerState.STOPPED, 15)
        save(window.statusBar(), "status-bar-local-server-stopped.png")
    finally:
        window.close()


SETS = {"tour": tour, "long-chat": long_chat, "recovery": recovery, "rough-edges": rough_edges, "sprinter": sprinter,
        "everyday": everyday, "compile": compile_in_background, "found-models": found_models,
        "long-message": long_message, "long-message-real": long_message_real, "local-server": local_server_shots}


if __name__ == "__main__":
    raise SystemExit(main())
