"""Reading a chat message of several lines: a paste, a backslash at the end of a line, a
block between lines of three double quotes."""
from __future__ import annotations

import os
import pty

import pytest

from engine.terminal_input import MessageReader, input_waiting


class PastingTerminal:
    """Input that arrives in bursts, as from a paste: the lines of one burst wait together."""

    def __init__(self, *bursts: list[str]):
        self.bursts = [list(burst) for burst in bursts]
        self.prompts: list[str] = []

    def read_line(self, prompt: str) -> str:
        self.prompts.append(prompt)
        while self.bursts and not self.bursts[0]:
            self.bursts.pop(0)
        if not self.bursts:
            raise EOFError
        return self.bursts[0].pop(0)

    def more_waiting(self) -> bool:
        return bool(self.bursts and self.bursts[0])

    def reader(self) -> MessageReader:
        return MessageReader(self.read_line, self.more_waiting)


def test_lines_pasted_together_are_one_message_and_the_next_typed_line_another():
    terminal = PastingTerminal(["Summarise this:", "", "first paragraph", "second paragraph"], ["thanks"])
    read = terminal.reader()
    assert read("you> ") == "Summarise this:\n\nfirst paragraph\nsecond paragraph"
    assert read("you> ") == "thanks"
    with pytest.raises(EOFError):
        read("you> ")


def test_a_backslash_at_the_end_of_a_line_continues_the_message():
    terminal = PastingTerminal(["first line\\"], ["second line\\"], ["third"], ["next message"])
    read = terminal.reader()
    assert read("you> ") == "first line\nsecond line\nthird"
    assert terminal.prompts == ["you> ", "...> ", "...> "]
    assert read("you> ") == "next message"


def test_lines_between_triple_quotes_are_one_message_kept_as_typed():
    terminal = PastingTerminal(['"""'], ["  indented"], ["ends in a backslash \\"], ['"""'], ["after"])
    read = terminal.reader()
    assert read("you> ") == "  indented\nends in a backslash \\"
    assert read("you> ") == "after"


def test_the_end_of_input_inside_a_message_keeps_what_was_typed_then_ends():
    read = PastingTerminal(['"""'], ["unfinished"]).reader()
    assert read("you> ") == "unfinished"
    with pytest.raises(EOFError):
        read("you> ")


def test_a_paste_into_a_real_terminal_is_seen_as_input_already_waiting():
    controller, terminal_fd = pty.openpty()
    with open(terminal_fd, encoding="utf-8") as terminal:
        def read_line(prompt: str) -> str:
            line = terminal.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")

        assert not input_waiting(terminal, wait_s=0.01)
        os.write(controller, b"one\ntwo\nthree\n")  # a terminal line discipline hands these over a line per read
        read = MessageReader(read_line, stream=terminal)
        assert read("you> ") == "one\ntwo\nthree"
        os.write(controller, b"typed later\n")
        assert read("you> ") == "typed later"
    os.close(controller)


def test_piped_input_is_read_a_line_per_message(tmp_path):
    piped = tmp_path / "input.txt"
    piped.write_text("hello\n/quit\n")
    with piped.open() as stream:
        assert not input_waiting(stream)
