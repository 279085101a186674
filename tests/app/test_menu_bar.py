"""The menu bar: File (new chat, export, quit), View (theme), Help (About Tandem)."""
from __future__ import annotations

import platform

from PySide6.QtCore import qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.about_dialog import AboutDialog
from app.message_widget import is_dark
from app.settings import load_settings
from engine import __version__
from tests.app.fake_engine import FakeEngine
from tests.app.helpers import send_and_wait


def menu_titles(window) -> dict[str, list[str]]:
    return {
        menu.title().replace("&", ""): [a.text().replace("&", "") for a in menu.actions() if not a.isSeparator()]
        for menu in (action.menu() for action in window.menuBar().actions())
    }


def test_the_menu_bar_has_file_view_and_help(ready_window):
    window = ready_window()
    menus = menu_titles(window)
    assert list(menus) == ["File", "View", "Help"]
    assert menus["File"] == ["New chat", "Export chat…", "Export all chats…", "Settings…", "Quit"]
    assert menus["View"][0] == "Theme" and "Colour tokens" in menus["View"] and "Speed panel" in menus["View"]
    assert menus["Help"] == ["About Tandem"]
    assert window.quit_action.shortcut().toString() == "Ctrl+Q"
    theme_menu = window.menuBar().actions()[1].menu().actions()[0].menu()
    assert [a.text() for a in theme_menu.actions()] == ["System", "Light", "Dark"]


def test_quit_closes_the_window_and_keeps_the_chat(ready_window, qtbot):
    window = ready_window()
    send_and_wait(qtbot, window, "Remember me")
    window.quit_action.trigger()
    assert not window.isVisible() and window._closed


def test_new_chat_in_the_file_menu_starts_an_empty_chat(ready_window, qtbot):
    window = ready_window()
    send_and_wait(qtbot, window, "First")
    window.new_action.trigger()
    assert window.controller.conversation_id is None and window.pane.view.messages == []


def test_the_dark_theme_applies_at_once_is_saved_and_comes_back_at_start(make_window, qtbot):
    window = make_window()
    assert not is_dark()
    window.theme_actions["dark"].trigger()
    try:
        assert is_dark() and "#2b3a55" in QApplication.instance().styleSheet()  # the dark user bubble
        assert load_settings()[0].theme == "dark"
        window.close()
        again = make_window()  # a new start reads the saved theme
        assert is_dark() and again.theme_actions["dark"].isChecked()
        again.theme_actions["light"].trigger()
        assert not is_dark() and load_settings()[0].theme == "light"
        again.theme_actions["system"].trigger()
        assert not is_dark() and load_settings()[0].theme == "system"
    finally:
        from app.theme import apply_theme

        apply_theme("system")  # the next test's application starts as the system's


def test_about_shows_versions_the_pair_and_where_files_live(ready_window, tandem_home):
    window = ready_window()
    dialog = window.open_about()
    assert isinstance(dialog, AboutDialog) and dialog.isVisible()
    text = dialog.text()
    assert f"Tandem: {__version__}" in text and f"Python: {platform.python_version()}" in text
    assert f"Qt: {qVersion()}" in text and "torch: " in text and "llama.cpp (llama-cpp-python): " in text
    assert "Pair: demo" in text and "Target: " in text and "Draft: " in text and "Runs on: cpu, bf16" in text
    assert "EAGLE-3 head: smollm2-135m-eagle3" in text
    assert text.count("EAGLE-3 head") == 1  # its own row, not the draft's too
    assert f"Chats: {tandem_home / 'data' / 'chats.sqlite3'}" in text
    assert f"Settings: {tandem_home / 'config' / 'app-settings.json'}" in text
    assert f"Cache folder: {tandem_home / 'cache'}" in text and "Downloaded models: " in text
    dialog.copy_button.click()
    assert QGuiApplication.clipboard().text() == text
    dialog.reject()


def test_about_and_the_speed_panel_say_when_tandem_tune_chose_the_runtime(ready_window):
    chosen = "llama.cpp, chosen by tandem tune on 2026-11-26: tree 80 tok/s (against torch 61 tok/s)"
    window = ready_window(FakeEngine(runtime_choice=chosen))
    assert chosen in window.speed_panel.values["runtime"].toolTip()
    dialog = window.open_about()
    assert f"Runtime chosen: {chosen}" in dialog.text()
    dialog.reject()
    unchosen = ready_window(FakeEngine())
    assert "Chosen by measurement" not in unchosen.speed_panel.values["runtime"].toolTip()
    dialog = unchosen.open_about()
    assert "Runtime chosen" not in dialog.text()
    dialog.reject()


def test_opening_about_imports_neither_torch_nor_llama_cpp():
    import subprocess
    import sys

    code = (
        "import sys; from app.about_dialog import about_rows; about_rows(None, []); "
        "print(sorted(m for m in ('torch', 'llama_cpp', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
