"""The conversation list: search keeps the open conversation selected, so Rename and Delete
stay usable after a search is cleared."""
from __future__ import annotations

from app.conversation_list import ConversationList
from app.storage import open_chat_store


def titles(conversations: ConversationList) -> list[str]:
    return [conversations.list.item(i).text() for i in range(conversations.list.count())]


def test_clearing_a_search_that_hid_the_open_conversation_selects_it_again(qtbot):
    store, _warning = open_chat_store()
    owls = store.create_conversation("Tell me about owls")
    cats = store.create_conversation("Tell me about cats")
    conversations = ConversationList(store)
    qtbot.addWidget(conversations)
    conversations.refresh(cats.id)
    assert conversations.rename_button.isEnabled() and conversations.delete_button.isEnabled()

    conversations.search.setText("owls")  # hides the open conversation
    assert titles(conversations) == ["Tell me about owls"]
    assert not conversations.rename_button.isEnabled()  # nothing selected to act on

    conversations.search.clear()
    assert conversations.current_id() == cats.id
    assert conversations.rename_button.isEnabled() and conversations.delete_button.isEnabled()
    store.close()


def test_a_conversation_chosen_during_a_search_stays_selected_after_it(qtbot):
    store, _warning = open_chat_store()
    owls = store.create_conversation("Tell me about owls")
    cats = store.create_conversation("Tell me about cats")
    conversations = ConversationList(store)
    qtbot.addWidget(conversations)
    conversations.refresh(cats.id)
    conversations.search.setText("owls")
    with qtbot.waitSignal(conversations.selected) as opened:
        conversations.list.setCurrentRow(0)
    assert opened.args == [owls.id]
    conversations.search.clear()
    assert conversations.current_id() == owls.id and conversations.rename_button.isEnabled()
    store.close()
