"""The chat's input line on a terminal: raw mode, so that a message of several lines stays
one message however it arrives.

The terminal's own line editing hands a program one line per read and echoes whatever is
typed, even into a reply that is streaming. Here the terminal is put in raw mode (no echo,
no line buffering; Ctrl-C still interrupts) for the whole chat, and this editor echoes:

- bracketed paste is switched on, and everything between ESC[200~ and ESC[201~ is text, its
  newlines included; the message goes only when Enter is pressed after it;
- a terminal without bracketed paste (or tmux send-keys) delivers pasted lines in one burst:
  an Enter with more input right behind it is a newline, not the end of the message;
- what is typed while a reply streams waits in the terminal, unechoed, and becomes the
  start of the next message, for the user to finish or edit;
- Ctrl-L clears the screen and draws the prompt again; Ctrl-D on an empty line ends the chat.
"""
from __future__ import annotations

import contextlib
import os
import select
import unicodedata
from collections.abc import Callable, Iterator
from typing import TextIO

from .terminal_input import BLOCK, CONTINUATION_PROMPT, CONTINUE, PASTE_WAIT_S
from .terminal_keys import BRACKETED_PASTE_OFF, BRACKETED_PASTE_ON, Key, KeyDecoder

try:
    import termios
except ImportError:  # Windows: its console has no termios; the chat reads lines there
    termios = None

READ_SIZE = 4096


def available() -> bool:
    """Whether this platform's terminals can be put in raw mode (not Windows consoles)."""
    return termios is not None


class LineEditor:
    """`read(prompt) -> str` for a chat on a terminal: one message per call, its lines joined
    with newlines; EOFError on Ctrl-D at an empty line. Use inside `terminal_mode()`."""

    def __init__(self, input_fd: int, screen: TextIO, clear_screen: Callable[[], None] | None = None):
        self.input_fd = input_fd
        self.screen = screen
        # Ctrl-L: the chat clears the screen (it owns the status row); this draws the prompt again.
        self.clear_screen = clear_screen or (lambda: self._write("\x1b[H\x1b[2J"))
        self.decoder = KeyDecoder()
        self.lines = [""]
        self.prompt = ""

    @contextlib.contextmanager
    def terminal_mode(self) -> Iterator[None]:
        saved = termios.tcgetattr(self.input_fd)
        raw = termios.tcgetattr(self.input_fd)
        raw[3] &= ~(termios.ICANON | termios.ECHO | termios.IEXTEN)  # ISIG stays: Ctrl-C stops a reply
        raw[6][termios.VMIN], raw[6][termios.VTIME] = 1, 0
        termios.tcsetattr(self.input_fd, termios.TCSANOW, raw)
        self._write(BRACKETED_PASTE_ON)
        try:
            yield
        finally:
            self._write(BRACKETED_PASTE_OFF)
            termios.tcsetattr(self.input_fd, termios.TCSADRAIN, saved)

    def __call__(self, prompt: str) -> str:
        self.prompt = prompt
        self.lines = [""]
        self._take_held_input()
        self._write(self._drawn())
        while True:
            try:
                keys = self._read_keys()
            except KeyboardInterrupt:  # Ctrl-C at the prompt drops the line, as a shell does
                self.lines = [""]
                self._write("^C\n" + self._drawn())
                continue
            for index, key in enumerate(keys):
                # An Enter with keys behind it never sends: it is a line of a paste.
                message = self._apply(key, lambda: index + 1 < len(keys) or self._input_waiting(PASTE_WAIT_S))
                if message is not None:
                    return message

    # Input

    def _read_keys(self) -> list[Key]:
        select.select([self.input_fd], [], [])
        data = os.read(self.input_fd, READ_SIZE)
        if not data:
            raise EOFError
        return self.decoder.feed(data)

    def _input_waiting(self, wait_s: float) -> bool:
        ready, _, _ = select.select([self.input_fd], [], [], wait_s)
        return bool(ready)

    def _take_held_input(self) -> None:
        """What was typed while the reply streamed becomes the start of this message: its
        text and newlines, never an Enter that sends it unseen, nor Ctrl-D or Ctrl-L."""
        keys: list[Key] = []
        while self._input_waiting(0):
            data = os.read(self.input_fd, READ_SIZE)
            if not data:
                break
            keys += self.decoder.feed(data)
        for key in keys:
            if key.kind == "text":
                self._insert(key.text, echo=False)
            elif key.kind == "enter":
                self.lines.append("")
            elif key.kind == "backspace":
                self._delete(echo=False)
        while len(self.lines) > 1 and not self.lines[-1]:
            self.lines.pop()

    # Editing

    def _apply(self, key: Key, more_in_burst: Callable[[], bool]) -> str | None:
        """Apply one key; the finished message when it ends one. `more_in_burst()`: whether
        more input came with this key, as the rest of a paste does."""
        if key.kind == "text":
            self._insert(key.text)
        elif key.kind == "enter":
            if more_in_burst():  # a line of a paste that came without brackets
                self._new_line()
            elif self._continues():
                if self.lines[0].strip() != BLOCK:
                    self.lines[-1] = self.lines[-1][: -len(CONTINUE)]
                self._new_line()
            else:
                self._write("\n")  # the reply starts on a line of its own
                return self._message()
        elif key.kind == "backspace":
            self._delete()
        elif key.kind == "end" and self.lines == [""]:
            self._write("\n")
            raise EOFError
        elif key.kind == "clear":
            self.clear_screen()
            self._write(self._drawn())
        return None

    def _continues(self) -> bool:
        """Whether Enter goes on to another line of the message: after a backslash, and in
        a block of lines between two lines of three double quotes."""
        if self.lines[0].strip() == BLOCK:
            return len(self.lines) == 1 or self.lines[-1].strip() != BLOCK
        return self.lines[-1].endswith(CONTINUE)

    def _message(self) -> str:
        if self.lines[0].strip() == BLOCK:
            return "\n".join(self.lines[1:-1])
        return "\n".join(self.lines).rstrip("\n")

    def _insert(self, text: str, echo: bool = True) -> None:
        first, *others = text.split("\n")
        self.lines[-1] += first
        if echo:
            self._write(first)
        for line in others:
            self._new_line(echo)
            self.lines[-1] += line
            if echo:
                self._write(line)

    def _new_line(self, echo: bool = True) -> None:
        self.lines.append("")
        if echo:
            self._write("\n" + CONTINUATION_PROMPT)

    def _delete(self, echo: bool = True) -> None:
        if self.lines[-1]:
            removed, self.lines[-1] = self.lines[-1][-1], self.lines[-1][:-1]
            width = 2 if unicodedata.east_asian_width(removed) in "WF" else 1
            if echo:
                self._write("\b" * width + " " * width + "\b" * width)
        elif len(self.lines) > 1:
            self.lines.pop()
            if echo:  # back up to the end of the line above
                prompt = self.prompt if len(self.lines) == 1 else CONTINUATION_PROMPT
                self._write("\r\x1b[2K\x1b[A\r\x1b[2K" + prompt + self.lines[-1])

    # Output

    def _drawn(self) -> str:
        """The prompt and the message so far, as they show from the start of a line."""
        return "\r" + self.prompt + f"\n{CONTINUATION_PROMPT}".join(self.lines)

    def _write(self, text: str) -> None:
        self.screen.write(text)
        self.screen.flush()
