"""The list of conversations: search by text, new, rename (in place), delete."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from .storage import ChatStore

ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationList(QWidget):
    selected = Signal(int)  # conversation id
    new_requested = Signal()
    delete_requested = Signal(int)
    renamed = Signal(int, str)

    def __init__(self, store: ChatStore):
        super().__init__()
        self.store = store
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.setSpacing(6)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        layout.addWidget(self.list, 1)
        buttons = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        layout.addLayout(buttons)

        self.new_button.clicked.connect(self.new_requested)
        # The open conversation, not the list's current item: a search that hides it leaves the
        # list without one, and clearing the search must select it again (Rename and Delete
        # act on the selected item, and stayed greyed out when it was lost).
        self.search.textChanged.connect(lambda: self.refresh(self._open_id))
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_edited)
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button.clicked.connect(self._confirm_delete)
        self._refreshing = False
        self._open_id: int | None = None  # the conversation the chat pane shows

    def refresh(self, select_id: int | None = None) -> None:
        """Reload titles from the store, keeping `select_id` (the open conversation) selected
        when it is listed."""
        self._open_id = select_id
        self._refreshing = True
        self.list.clear()
        for conversation in self.store.list_conversations(self.search.text()):
            item = QListWidgetItem(conversation.title)
            item.setData(ID_ROLE, conversation.id)
            item.setToolTip(conversation.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conversation.id == select_id:
                self.list.setCurrentItem(item)
        self._refreshing = False
        has_selection = self.list.currentItem() is not None
        self.rename_button.setEnabled(has_selection)
        self.delete_button.setEnabled(has_selection)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else None

    def rename_current(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _on_current_changed(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        self.rename_button.setEnabled(current is not None)
        self.delete_button.setEnabled(current is not None)
        if current is not None and not self._refreshing:
            self._open_id = current.data(ID_ROLE)
            self.selected.emit(self._open_id)

    def _on_item_edited(self, item: QListWidgetItem) -> None:
        if self._refreshing:
            return
        title = item.text().strip()
        conversation_id = item.data(ID_ROLE)
        if title:
            self.renamed.emit(conversation_id, title)
        else:  # an empty title is not a name: put the old one back
            old = self.store.conversation(conversation_id)
            self._refreshing = True
            item.setText(old.title if old else "")
            self._refreshing = False

    def _confirm_delete(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete conversation",
            f"Delete “{item.text()}” and all its messages? This cannot be undone.",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(item.data(ID_ROLE))
