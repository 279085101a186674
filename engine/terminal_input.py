"""Reading one chat message line by line, where a message may span lines: piped input, and
a terminal where the chat's raw-mode editor (engine/terminal_editor.py) cannot run.

A terminal hands a program one line per read, so a pasted paragraph would arrive as several
messages. Lines that arrive together are one message: after each line, input that is already
waiting (the rest of a paste) is read too. Typing can say so explicitly as well: a line ending
in a backslash continues on the next, and lines between two lines of three double quotes
are one message.

Piped input (a script feeding `tandem chat`) arrives all at once whatever it means, so only
a terminal's timing is taken as a paste; a pipe is read a line per message, and the explicit
continuations work there too.
"""
from __future__ import annotations

import select
import sys
from collections.abc import Callable
from typing import TextIO

CONTINUE = "\\"  # a line ending in this continues on the next
BLOCK = '"""'  # a line of just this opens a block of lines, and the next one closes it
CONTINUATION_PROMPT = "...> "
# How long after a line the next one may come and still be part of the same paste: terminals
# write a paste at once, but some hand it over in pieces; no one types a line in 30 ms.
PASTE_WAIT_S = 0.03


def input_waiting(stream: TextIO, wait_s: float = PASTE_WAIT_S) -> bool:
    """Whether `stream`, a terminal, has more input ready within `wait_s` seconds."""
    try:
        if not stream.isatty():
            return False
        ready, _, _ = select.select([stream], [], [], wait_s)
    except (OSError, ValueError):  # a closed stream; a Windows console, which select cannot watch
        return False
    return bool(ready)


class MessageReader:
    """`read(prompt) -> str` for the terminal chat: one message per call, its lines joined
    with newlines. Raises EOFError at the end of input, as `input()` does; a message cut
    short by the end of input is returned first."""

    def __init__(
        self,
        read_line: Callable[[str], str] = input,
        more_waiting: Callable[[], bool] | None = None,
        stream: TextIO | None = None,
    ):
        self.read_line = read_line
        stream = stream if stream is not None else sys.stdin
        self.more_waiting = more_waiting or (lambda: input_waiting(stream))
        self._ended = False

    def __call__(self, prompt: str) -> str:
        if self._ended:
            raise EOFError
        first = self.read_line(prompt)
        if first.strip() == BLOCK:
            return "\n".join(self._block())
        lines = [first]
        while True:
            if lines[-1].endswith(CONTINUE):
                lines[-1] = lines[-1][: -len(CONTINUE)]
                prompt = CONTINUATION_PROMPT
            elif self.more_waiting():
                prompt = ""  # the rest of a paste: the terminal has echoed it already
            else:
                return "\n".join(lines)
            line = self._next_line(prompt)
            if line is None:
                return "\n".join(lines)
            lines.append(line)

    def _block(self) -> list[str]:
        lines = []
        while (line := self._next_line(CONTINUATION_PROMPT)) is not None and line.strip() != BLOCK:
            lines.append(line)
        return lines

    def _next_line(self, prompt: str) -> str | None:
        """The next line of a message; None at the end of input, which the next call reports."""
        try:
            return self.read_line(prompt)
        except EOFError:
            self._ended = True
            return None
