"""The pair picker lists the models found on this machine (a fake home laid out as LM Studio,
Ollama, the Hugging Face cache, GPT4All and Jan lay theirs out), offers a found target its
found drafts and EAGLE-3 head, and says which methods the pair gets."""
from __future__ import annotations

from PySide6.QtWidgets import QDialogButtonBox, QFileDialog

from app.found_models import SEARCHING
from app.model_scan import ModelScan
from engine.discovery.folders import search_folders
from engine.pairs import load_user_pairs
from tests.app.test_settings_dialog import draft_items
from tests.engine.discovery.fake_machine import furnished_home, write_gguf


def table_rows(picker) -> dict[str, tuple[list[str], bool]]:
    table = picker.found_models.table
    rows = {}
    for row in range(table.topLevelItemCount()):
        item = table.topLevelItem(row)
        rows[item.text(0)] = ([item.text(column) for column in range(1, 5)], item.isDisabled())
    return rows


def open_picker_on(window, qtbot):
    picker = window.open_settings().open_picker(None)
    qtbot.waitUntil(lambda: picker.found is not None, timeout=5000)
    return picker


def test_the_picker_lists_found_models_with_family_size_quantisation_and_where(ready_window, qtbot, tmp_path, monkeypatch):
    home = tmp_path / "machine"
    furnished_home(home)
    monkeypatch.setenv("TANDEM_SEARCH_HOME", str(home))
    picker = open_picker_on(ready_window(), qtbot)
    rows = table_rows(picker)
    assert rows["lmstudio-community/Llama-Big-GGUF/Llama-Big-Q4_K_M"] == (["llama", "20K", "Q4_K_M", "LM Studio"], False)
    assert rows["llama-small:1b"] == (["llama", "1.3K", "Q8_0", "Ollama"], False)
    assert rows["org/llama-mini"] == (["llama", "256", "BF16", "Hugging Face cache"], False)
    assert rows["other-7b"] == (["qwen2", "3.3K", "F16", "Jan"], False)
    where, disabled = rows["gone:latest"][0][3], rows["gone:latest"][1]
    assert disabled and where.startswith("Ollama: Ollama lists gone:latest, but its model file sha256-")
    status = picker.found_models.status.text()
    assert status.startswith("5 models found in LM Studio, Ollama, Hugging Face cache, GPT4All, Jan. gone:latest cannot be used: Ollama lists")
    assert "`ollama pull gone:latest` fetches it again)" in status
    # Found models are targets too, beside the bundled demo and the user's own.
    assert picker.target.findData(str(home / ".lmstudio/models/lmstudio-community/Llama-Big-GGUF/Llama-Big-Q4_K_M.gguf")) > 0


def test_a_found_target_is_offered_its_found_drafts_its_eagle_head_and_n_gram(ready_window, qtbot, tmp_path, monkeypatch):
    home = tmp_path / "machine"
    paths = furnished_home(home)
    monkeypatch.setenv("TANDEM_SEARCH_HOME", str(home))
    picker = open_picker_on(ready_window(), qtbot)
    table = picker.found_models.table
    big = next(table.topLevelItem(row) for row in range(table.topLevelItemCount())
               if table.topLevelItem(row).text(0).endswith("Llama-Big-Q4_K_M"))
    table.setCurrentItem(big)  # choosing the row chooses the target
    assert picker.target.currentData() == str(paths["target"])
    qtbot.waitUntil(lambda: all("checking" not in r for r in picker.reasons.values() if r), timeout=5000)
    items = draft_items(picker)
    assert items[""][1]  # n-gram lookup always
    for key in ("hub folder", "gpt4all draft", "ollama draft"):
        assert items[str(paths[key])][1], key  # found with the target's tokenizer: offered at once
    assert str(paths["jan other"]) not in items  # another tokenizer: not offered
    assert items[str(paths["ollama draft"])][0] == "llama-small:1b — llama 1.3K Q8_0, Ollama"
    assert not picker.eagle_head.isHidden() and "someone/EAGLE3-Llama-Big" in picker.eagle_head.text()
    assert "EAGLE-3 tree" in picker.methods_line.text() and "1 other model found here uses another tokenizer" in picker.methods_line.text()

    picker.drafts.setCurrentRow(list(items).index(str(paths["ollama draft"])))
    assert "tree" in picker.methods_line.text() and "SPRINTER and the adaptive chain once" in picker.methods_line.text()
    assert picker.name.text() == "Llama-Big-Q4_K_M + llama-small:1b"
    picker.eagle_head.setChecked(False)
    assert "EAGLE-3" not in picker.methods_line.text()
    picker.eagle_head.setChecked(True)
    picker.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    (saved,) = load_user_pairs()
    assert (saved.target.source, saved.draft.source, saved.eagle) == (str(paths["target"]), str(paths["ollama draft"]), str(paths["hub head"]))


def test_the_scan_runs_off_the_window_thread_and_an_added_folder_is_searched(ready_window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_SEARCH_HOME", str(tmp_path / "empty"))
    started, scan_in_the_background = [], ModelScan.start
    monkeypatch.setattr(ModelScan, "start", lambda scan: started.append(scan))  # held: the window goes on without it
    picker = ready_window().open_settings().open_picker(None)
    assert started and picker.found is None and picker.found_models.status.text() == SEARCHING
    assert picker.target.count() >= 1 and picker.repo_id.isEnabled()  # typing a path or repo id still works meanwhile
    monkeypatch.setattr(ModelScan, "start", scan_in_the_background)
    folder = tmp_path / "my models"
    write_gguf(folder / "mine.gguf")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *args: str(folder)))
    picker.found_models.add_folder_button.click()
    qtbot.waitUntil(lambda: picker.found is not None, timeout=5000)
    assert search_folders() == [str(folder)]
    assert table_rows(picker)["mine"][0][3] == "your folder"
