"""The pair picker's list of models found on this machine (engine/discovery): family, size,
quantisation and where each lives; choosing one makes it the target. A model that cannot be
used is listed greyed, with the reason in its row, so nobody wonders where it went."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.discovery import Found, FoundModel
from engine.discovery.folders import add_search_folder

SOURCE_ROLE = Qt.ItemDataRole.UserRole
COLUMNS = ("Model", "Family", "Size", "Quantisation", "Where")
SEARCHING = "Looking for models in LM Studio's, Ollama's, GPT4All's and Jan's folders and the Hugging Face cache…"


def where_label(model: FoundModel) -> str:
    return model.app if model.usable else f"{model.app}: {model.problem}"


def found_summary(found: Found) -> str:
    """One line: how many models, from which apps, and how many cannot be used."""
    usable = found.usable
    if not found.models:
        places = ", ".join(dict.fromkeys(root.app for root in found.searched)) or "none of the usual places exist here"
        return f"No models found (searched: {places}). Add a folder to search, or a model below."
    apps = ", ".join(dict.fromkeys(model.app for model in usable))
    line = f"{len(usable)} model{'s' if len(usable) != 1 else ''} found" + (f" in {apps}" if apps else "")
    broken = [model for model in found.models if not model.usable]
    if len(broken) == 1:  # one reason fits here whole; the row's Where column cuts it short
        line += f". {broken[0].name} cannot be used: {broken[0].problem.rstrip('.')}"
    elif broken:
        line += f"; {len(broken)} cannot be used (greyed: the reason is in each row's tooltip)"
    return line + ". Choose one as the target."


class FoundModelsPanel(QWidget):
    target_chosen = Signal(str)  # the source of a usable found model
    folder_added = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = QTreeWidget()
        self.table.setColumnCount(len(COLUMNS))
        self.table.setHeaderLabels(COLUMNS)
        self.table.setRootIsDecorated(False)
        self.table.setUniformRowHeights(True)
        self.table.setMinimumHeight(130)
        layout.addWidget(self.table)
        row = QHBoxLayout()
        self.status = QLabel(SEARCHING)
        self.status.setObjectName("foundStatus")
        self.status.setWordWrap(True)
        self.add_folder_button = QPushButton("Search another folder…")
        self.add_folder_button.setToolTip("Tandem remembers the folder and lists the models in it; nothing is copied")
        row.addWidget(self.status, 1)
        row.addWidget(self.add_folder_button)
        layout.addLayout(row)
        self.table.currentItemChanged.connect(self._on_current_changed)
        self.add_folder_button.clicked.connect(self._choose_folder)

    def show_searching(self) -> None:
        self.status.setText(SEARCHING)

    def show_found(self, found: Found, target: str) -> None:
        self.table.blockSignals(True)
        self.table.clear()
        for model in found.models:
            item = QTreeWidgetItem([model.name, model.family, model.size_label, model.quantisation, where_label(model)])
            item.setData(0, SOURCE_ROLE, model.source)
            item.setToolTip(0, model.source)
            item.setToolTip(4, model.problem or model.source)
            if not model.usable:
                item.setFlags(item.flags() & ~(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable))
            self.table.addTopLevelItem(item)
        for column in range(len(COLUMNS) - 1):
            self.table.resizeColumnToContents(column)
        self.table.blockSignals(False)
        self.select(target)
        self.status.setText(found_summary(found))

    def show_failure(self, error: Exception) -> None:
        self.status.setText(f"Looking for models failed: {error}")

    def select(self, source: str) -> None:
        """Mark `source`'s row (when it is listed) without announcing a choice."""
        self.table.blockSignals(True)
        self.table.setCurrentItem(None)
        for row in range(self.table.topLevelItemCount()):
            item = self.table.topLevelItem(row)
            if item.data(0, SOURCE_ROLE) == source:
                self.table.setCurrentItem(item)
        self.table.blockSignals(False)

    def _on_current_changed(self, item: QTreeWidgetItem | None, _previous) -> None:
        if item is not None:
            self.target_chosen.emit(item.data(0, SOURCE_ROLE))

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder with GGUF files or model folders")
        if folder:
            add_search_folder(folder)
            self.folder_added.emit(folder)
