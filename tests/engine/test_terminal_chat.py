"""`tandem chat` on a tiny random pair: Ctrl-C keeps the partial reply, slash commands never
end the chat, `/verifier` switches to SPRINTER and back; on a real (pseudo-)terminal, a
paste is one message, typing during a reply waits for the next, the stats line fits."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import termios
import threading
import time

import pytest

from engine import methods
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


# On a real terminal: the chat's input line in raw mode, driven through a pseudo-terminal.
# The chat runs in a thread over the pty's terminal side; the test types on the other side.

STATUS_WRITE = re.compile(r"\x1b7.*?\x1b8", re.DOTALL)  # the status row, drawn with the cursor saved


class Terminal:
    """A pseudo-terminal of `columns` x `rows` with a chat running on it; `screen` is every
    byte the chat wrote, as text."""

    def __init__(self, pair, settings: DecodeSettings, columns: int = 80, rows: int = 24):
        self.controller, terminal_fd = pty.openpty()
        fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.keyboard = open(terminal_fd, encoding="utf-8", closefd=False)
        self.display = open(terminal_fd, "w", encoding="utf-8")
        self.chat = TerminalChat(pair, settings, None, out=self.display, stdin=self.keyboard)
        self.screen = ""
        self._lock = threading.Lock()
        self.result: list[int] = []
        threading.Thread(target=self._read_screen, daemon=True).start()
        self.thread = threading.Thread(target=lambda: self.result.append(self.chat.run()), daemon=True)
        self.thread.start()

    def _read_screen(self) -> None:
        while True:
            try:
                data = os.read(self.controller, 4096)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.screen += data.decode("utf-8", errors="replace")

    def type(self, text: str) -> None:
        os.write(self.controller, text.encode())

    def wait_for(self, pattern: str, count: int = 1, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while self.screen.count(pattern) < count:
            assert time.monotonic() < deadline, f"waited for {count} x {pattern!r}; the screen shows {self.screen!r}"
            time.sleep(0.01)

    def quit(self, prompts_before: int) -> str:
        """Ctrl-D once the prompt has shown `prompts_before` times; what the screen showed."""
        self.wait_for("you> ", count=prompts_before)
        self.type("\x04")
        self.thread.join(timeout=20)
        assert self.result == [0]
        modes = termios.tcgetattr(self.keyboard.fileno())[3]
        assert modes & termios.ICANON and modes & termios.ECHO  # the terminal is as the chat found it
        time.sleep(0.05)
        os.close(self.controller)
        self.display.close()
        return self.screen


@pytest.fixture
def terminal_chat(tiny_pair):
    terminals = []

    def start(**size) -> Terminal:
        terminals.append(Terminal(tiny_pair, DecodeSettings(method="ar", max_new_tokens=6), **size))
        return terminals[-1]

    yield start
    for terminal in terminals:
        if terminal.thread.is_alive():
            terminal.type("\x04")
            terminal.thread.join(timeout=5)


def user_messages(chat: TerminalChat) -> list[str]:
    return [m.content for m in chat.history if m.role == "user"]


def test_a_bracketed_paste_is_one_message_sent_only_on_enter(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    assert "\x1b[?2004h" in terminal.screen  # bracketed paste on
    terminal.type("\x1b[200~first line\rsecond line\r\rlast line\x1b[201~")
    terminal.wait_for("last line")
    time.sleep(0.3)
    assert "tandem> " not in terminal.screen  # nothing is sent before Enter
    terminal.type("\r")
    screen = terminal.quit(prompts_before=2)
    assert user_messages(terminal.chat) == ["first line\nsecond line\n\nlast line"]
    assert screen.count("tandem> ") == 1  # one reply, and the last line is not sent again
    assert "\x1b[?2004l" in screen  # and off at the end


def test_lines_that_arrive_together_without_brackets_are_one_message(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("one\rtwo\rthree\r")  # as tmux send-keys delivers them
    terminal.wait_for("you> ", count=2)
    terminal.type("four\r")
    screen = terminal.quit(prompts_before=3)
    assert user_messages(terminal.chat) == ["one\ntwo\nthree", "four"]
    assert screen.count("tandem> ") == 2


def test_the_reply_starts_on_a_line_of_its_own(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("\x1b[200~w1 w2\rw3\x1b[201~\r")
    screen = terminal.quit(prompts_before=2)
    before_reply = STATUS_WRITE.sub("", screen.split("tandem> ")[0])
    assert before_reply.endswith("w3\r\n")  # the message, then a new line


def test_what_is_typed_during_a_reply_is_held_and_starts_the_next_message(tiny_pair, terminal_chat):
    typed = threading.Event()
    generate = tiny_pair.generate

    def slow_generate(*args, **kwargs):
        for number, event in enumerate(generate(*args, **kwargs)):
            if number == 2:
                typed.wait(timeout=10)  # the reply is streaming while the user types
            yield event

    tiny_pair.generate = slow_generate
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("w1 w2\r")
    terminal.wait_for("tandem> ")
    terminal.type("next question")
    time.sleep(0.2)
    typed.set()
    terminal.wait_for("you> next question")
    reply = terminal.screen.split("tandem> ")[1].split("you> ")[0]
    assert "next question" not in reply  # not echoed into the reply
    terminal.type(" please\r")
    terminal.quit(prompts_before=3)
    assert user_messages(terminal.chat) == ["w1 w2", "next question please"]


def test_ctrl_l_clears_the_screen_and_draws_the_prompt_again(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("half typed")
    terminal.wait_for("half typed")
    terminal.type("\x0c")
    terminal.wait_for("\x1b[2J")
    terminal.wait_for("you> half typed")
    terminal.type(" w1\r")
    screen = terminal.quit(prompts_before=3)  # one drawn again
    assert "^L" not in screen
    assert user_messages(terminal.chat) == ["half typed w1"]


def test_the_stats_line_fits_a_narrow_terminal_and_clears_what_was_there(terminal_chat):
    terminal = terminal_chat(columns=30)
    terminal.wait_for("you> ")
    terminal.type("w1 w2\r")
    screen = terminal.quit(prompts_before=2)
    shown = re.findall(r"\x1b\[7m(.*?)\x1b\[0m\x1b\[K", screen)
    assert shown and all(len(text) <= 29 for text in shown)
    assert any(text.endswith("…") for text in shown)  # cut, and the cut marked


def test_backspace_edits_the_line_and_ctrl_d_on_an_empty_line_ends_the_chat(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("w1 w9\x7f2\r")
    terminal.quit(prompts_before=2)
    assert user_messages(terminal.chat) == ["w1 w2"]


def test_piped_input_is_still_read_a_line_per_message(tiny_pair, tmp_path):
    piped = tmp_path / "input.txt"
    piped.write_text("w1 w2\nw3\n/quit\n")
    out = io.StringIO()
    with piped.open() as stdin:
        chat = TerminalChat(tiny_pair, DecodeSettings(method="ar", max_new_tokens=4), None, out=out, stdin=stdin)
        assert chat.run() == 0
    assert user_messages(chat) == ["w1 w2", "w3"]
    assert "\x1b[" not in out.getvalue()
    assert "you> w1 w2\ntandem> " in out.getvalue()  # a transcript, each reply on its own line


def test_a_backslash_or_a_block_of_triple_quotes_continues_a_typed_message(terminal_chat):
    terminal = terminal_chat()
    terminal.wait_for("you> ")
    terminal.type("w1\\")
    time.sleep(0.1)  # typed, not pasted: each Enter on its own
    terminal.type("\r")
    terminal.wait_for("...> ")
    terminal.type("w2\r")
    terminal.wait_for("you> ", count=2)
    for line in ['"""', "w3 \\", "w4", '"""']:
        terminal.type(line)
        time.sleep(0.1)
        terminal.type("\r")
    terminal.quit(prompts_before=3)
    assert user_messages(terminal.chat) == ["w1\nw2", "w3 \\\nw4"]


def test_continue_carries_on_a_reply_the_token_limit_stopped(tiny_pair):
    """/continue: greedy, a 5-token reply continued for 5 more is the 10-token reply, and the
    conversation keeps it as one assistant message."""
    question = "w1 w2 w3 w1 w2"
    whole, _ = chat_with(tiny_pair, [question], DecodeSettings(method="ar", max_new_tokens=10))
    cut, printed = chat_with(tiny_pair, [question, "/continue"], DecodeSettings(method="ar", max_new_tokens=5))
    assert "[stopped at the 5-token limit: /continue writes more]" in printed
    assert [m.role for m in cut.history] == ["user", "assistant"]
    assert cut.history[-1].content == whole.history[-1].content


def test_continue_with_nothing_to_continue_says_so(tiny_pair):
    _, printed = chat_with(tiny_pair, ["/continue"])
    assert "(there is no reply to continue)" in printed


def test_the_help_lists_every_method_of_the_table(tiny_pair):
    _chat, printed = chat_with(tiny_pair, ["/help"])
    (listed,) = re.findall(r"/method (\S+) ", printed)
    assert listed.split("|") == [row.name for row in methods.TABLE]


def test_continue_after_a_reply_that_ended_on_its_own_says_why_nothing_more_came(tiny_pair):
    # The target's third greedy token after "w9" becomes its stop token: the reply ends on its own.
    first, _ = chat_with(tiny_pair, ["w9"], DecodeSettings(method="ar", max_new_tokens=5))
    third = tiny_pair.tokenizer.encode(first.history[-1].content, add_special_tokens=False)[2]
    tiny_pair.stop_token_ids = frozenset({third})
    chat, printed = chat_with(tiny_pair, ["w9", "/continue"], DecodeSettings(method="ar", max_new_tokens=5))
    assert "(nothing more was written: the model ends its reply there; ask something to go on)" in printed
    assert [m.role for m in chat.history] == ["user", "assistant"]
