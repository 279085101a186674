"""`tandem chat` on a tiny random pair: Ctrl-C keeps the partial reply, slash commands never
end the chat."""
from __future__ import annotations

import io

import pytest

from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.terminal_chat import TerminalChat
from tests.engine.test_session import interrupt_target_call
from tests.engine.test_terminal_input import PastingTerminal
from tests.engine.tiny_models import tiny_word_pair


@pytest.fixture
def tiny_pair(make_word_tokenizer):
    return tiny_word_pair(make_word_tokenizer)


def chat_with(pair, lines: list[str], settings: DecodeSettings | None = None) -> tuple[TerminalChat, str]:
    """Run a chat that reads `lines` and then quits; return it and what it printed."""
    remaining = iter([*lines, "/quit"])
    out = io.StringIO()
    chat = TerminalChat(pair, settings or DecodeSettings(method="ar", max_new_tokens=12), None,
                        read=lambda prompt: next(remaining), out=out)
    assert chat.run() == 0
    return chat, out.getvalue()


def test_ctrl_c_keeps_shows_and_stores_the_reply_so_far(tiny_pair):
    interrupt_target_call(tiny_pair, 5)  # `ar`: Ctrl-C after four tokens
    chat, printed = chat_with(tiny_pair, ["w1 w2"])
    assert [m.role for m in chat.history] == ["user", "assistant"]
    partial = chat.history[1].content
    assert partial and partial in printed
    assert "[stopped]" in printed
    assert chat.last_stats.tokens_generated == 4
    assert "4 tokens" in printed


def test_a_conversation_goes_on_after_ctrl_c(tiny_pair):
    interrupt_target_call(tiny_pair, 3)
    chat, _printed = chat_with(tiny_pair, ["w1 w2", "w3 w4"])
    assert [m.role for m in chat.history] == ["user", "assistant", "user", "assistant"]
    assert chat.last_stats.tokens_generated == 12


def test_a_method_the_pair_cannot_run_is_refused_with_the_reason_and_the_chat_goes_on(tiny_pair):
    chat, printed = chat_with(tiny_pair, ["/method tree", "w1 w2"])
    assert "needs a draft model" in printed
    assert chat.settings.method == "ar"
    assert [m.role for m in chat.history] == ["user", "assistant"]


def test_a_start_with_a_method_the_pair_cannot_run_falls_back_to_one_it_can(tiny_pair):
    chat, printed = chat_with(tiny_pair, ["w1 w2"], DecodeSettings(method="staged", max_new_tokens=4))
    assert "needs a draft model" in printed
    assert chat.settings.method == "chain"
    assert [m.role for m in chat.history] == ["user", "assistant"]


def test_a_pasted_paragraph_is_sent_as_one_message(tiny_pair):
    terminal = PastingTerminal(["w1 w2", "w3 w4", "w5"], ["/quit"])
    out = io.StringIO()
    chat = TerminalChat(tiny_pair, DecodeSettings(method="ar", max_new_tokens=4), None, read=terminal.reader(), out=out)
    assert chat.run() == 0
    assert [(m.role, m.content) for m in chat.history[:1]] == [("user", "w1 w2\nw3 w4\nw5")]
    assert [m.role for m in chat.history] == ["user", "assistant"]  # one reply, not three
    assert out.getvalue().count("tandem> ") == 1


def test_the_help_says_how_to_write_a_message_of_several_lines(tiny_pair):
    _chat, printed = chat_with(tiny_pair, ["/help"])
    assert "paste" in printed and '"""' in printed and "\\" in printed
