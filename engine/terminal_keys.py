"""Keys from a terminal in raw mode: the bytes a read returns, turned into what they mean.

A terminal sends escape sequences for keys such as the arrows, and, with bracketed paste
on, wraps a paste between ESC[200~ and ESC[201~ so that a pasted newline can be told from
a typed Enter. A sequence may be split across reads; the decoder keeps the unfinished part
for the next one.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass

ESC = "\x1b"
PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
BRACKETED_PASTE_ON = "\x1b[?2004h"
BRACKETED_PASTE_OFF = "\x1b[?2004l"


@dataclass(frozen=True)
class Key:
    """One thing the user did: `kind` is "text" (with the `text`), "enter", "backspace",
    "end" (Ctrl-D), "clear" (Ctrl-L), "paste_start" or "paste_end"."""

    kind: str
    text: str = ""


ENTER = Key("enter")
BACKSPACE = Key("backspace")
END = Key("end")
CLEAR = Key("clear")
PASTE_STARTS = Key("paste_start")
PASTE_ENDS = Key("paste_end")

CONTROL_KEYS = {"\r": ENTER, "\n": ENTER, "\x7f": BACKSPACE, "\x08": BACKSPACE, "\x04": END, "\x0c": CLEAR}


class KeyDecoder:
    """`feed(bytes) -> [Key]`; inside a bracketed paste every character is text, a newline too."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unfinished = ""  # the start of an escape sequence the next read completes
        self.in_paste = False

    def feed(self, data: bytes) -> list[Key]:
        text = self._unfinished + self._utf8.decode(data)
        self._unfinished = ""
        keys: list[Key] = []
        position = 0
        while position < len(text):
            character = text[position]
            if character == ESC:
                length = _escape_length(text, position)
                if length is None:  # cut by the end of this read
                    self._unfinished = text[position:]
                    break
                keys += self._escape(text[position: position + length])
                position += length
                continue
            keys += self._character(character)
            position += 1
        return _joined(keys)

    def _escape(self, sequence: str) -> list[Key]:
        if sequence == PASTE_START:
            self.in_paste = True
            return [PASTE_STARTS]
        if sequence == PASTE_END:
            self.in_paste = False
            return [PASTE_ENDS]
        return []  # arrows, function keys, Alt+key: this editor has no use for them

    def _character(self, character: str) -> list[Key]:
        if self.in_paste:
            if character in "\r\n":
                return [Key("text", "\n")]
            return [Key("text", character)] if character == "\t" or character.isprintable() else []
        if character in CONTROL_KEYS:
            return [CONTROL_KEYS[character]]
        return [Key("text", character)] if character == "\t" or character.isprintable() else []


def _escape_length(text: str, start: int) -> int | None:
    """The length of the escape sequence at `start`, or None when `text` ends inside it."""
    if start + 1 >= len(text):
        return None
    introducer = text[start + 1]
    if introducer == "[":  # CSI: parameters and intermediates, then one final byte
        for end in range(start + 2, len(text)):
            if "\x40" <= text[end] <= "\x7e":
                return end - start + 1
        return None
    if introducer == "O":  # SS3: one more character (F1-F4, arrows in application mode)
        return 3 if start + 2 < len(text) else None
    return 2  # Alt+key


def _joined(keys: list[Key]) -> list[Key]:
    """Consecutive text keys as one, so that a paste is echoed in one write."""
    joined: list[Key] = []
    for key in keys:
        if key.kind == "text" and joined and joined[-1].kind == "text":
            joined[-1] = Key("text", joined[-1].text + key.text)
        else:
            joined.append(key)
    return joined
