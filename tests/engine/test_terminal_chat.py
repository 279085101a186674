"""`tandem chat` on a tiny random pair: Ctrl-C keeps the partial reply, slash commands never
end the chat, `/verifier` switches to SPRINTER and back."""
from __future__ import annotations

import io
import re

import pytest

from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.methods import default_method
from engine.terminal_chat import TerminalChat
from tests.engine.heads_fixtures import fixed_heads, tiny_draft_pair
from tests.engine.test_session import LONG_MESSAGE, interrupt_target_call, long_context_pair
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
    assert chat.settings.method == "auto"
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


class TerminalScreen(io.StringIO):
    """What a terminal was sent."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("output", ["terminal", "piped"])
def test_a_long_message_shows_how_far_reading_it_got(make_word_tokenizer, output):
    pair = long_context_pair(make_word_tokenizer)
    screen, errors = (TerminalScreen(), io.StringIO()) if output == "terminal" else (io.StringIO(), TerminalScreen())
    lines = iter([LONG_MESSAGE, "/quit"])
    chat = TerminalChat(pair, DecodeSettings(method="ar", max_new_tokens=4), None,
                        read=lambda prompt: next(lines), out=screen, stderr=errors)
    assert chat.run() == 0
    progress_shown = (screen if output == "terminal" else errors).getvalue()
    percentages = [int(p) for p in re.findall(r"reading your message… (\d+)%", progress_shown)]
    assert len(percentages) >= 5 and percentages == sorted(percentages)
    assert percentages[0] == 0 and percentages[-1] == 100
    if output == "terminal":  # all of it before the reply's first word
        reply_start = progress_shown.index(chat.history[1].content.split()[0], progress_shown.index("tandem> "))
        assert progress_shown.rindex("100%") < reply_start
    else:
        assert progress_shown.endswith("100%\033[K\n")  # the finished line stays
        assert "reading" not in screen.getvalue()  # the piped transcript holds the conversation only


def test_a_short_message_shows_no_reading_progress(tiny_pair):
    screen = TerminalScreen()
    lines = iter(["w1 w2", "/quit"])
    TerminalChat(tiny_pair, DecodeSettings(method="ar", max_new_tokens=4), None, read=lambda p: next(lines), out=screen).run()
    assert "reading your message" not in screen.getvalue()


def test_the_help_lists_the_verifier_command(tiny_pair):
    _chat, printed = chat_with(tiny_pair, ["/help"])
    assert "/verifier exact|sprinter" in printed and "approximate" in printed


def test_sprinter_is_refused_with_what_to_do_when_the_pair_cannot_run_it(tiny_pair, make_word_tokenizer):
    chat, printed = chat_with(tiny_pair, ["/verifier sprinter", "w1 w2"])
    assert "SPRINTER needs a draft model" in printed and "The verifier stays exact." in printed
    assert chat.settings.method == "ar" and chat.last_stats.exact

    uncalibrated = tiny_draft_pair(make_word_tokenizer)
    chat, printed = chat_with(uncalibrated, ["/verifier sprinter"], DecodeSettings(method="chain", max_new_tokens=4))
    assert "needs heads calibrated for the pair 'tiny'" in printed and "tandem calibrate --pair tiny" in printed
    assert chat.settings.method == "chain"

    uncalibrated.heads_problem = "The calibrated heads were trained on a draft of another width; run tandem calibrate again."
    _chat, printed = chat_with(uncalibrated, ["/verifier sprinter"], DecodeSettings(method="chain", max_new_tokens=4))
    assert "another width" in printed


def test_verifier_sprinter_writes_approximate_replies_and_exact_brings_the_method_back(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    pair.attach_heads(fixed_heads(passes=True))  # a verifier that passes every token
    chat, printed = chat_with(pair, ["/verifier sprinter", "w1 w2", "/verifier exact", "w3 w4"],
                              DecodeSettings(method="chain", max_new_tokens=16))  # one SPRINTER round
    assert "(verifier: SPRINTER, approximate" in printed
    replies = printed.split("tandem> ")[1:]
    assert "approximate: unchecked tokens 16, target calls skipped 1" in replies[0]
    assert "approximate" not in replies[1]
    assert "(verifier: exact, method chain)" in printed and chat.settings.method == "chain"
    assert chat.last_stats.exact and chat.last_stats.method == "chain"


def test_a_chat_started_with_sprinter_says_so_and_goes_back_to_the_pairs_default(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    pair.attach_heads(fixed_heads(passes=True))
    chat, printed = chat_with(pair, ["/verifier", "/verifier exact"], DecodeSettings(method="sprinter", max_new_tokens=4))
    assert printed.count("(verifier: SPRINTER, approximate") == 2  # at the start, and asked
    assert chat.settings.method == default_method(pair.methods)
