"""Decoding what a terminal in raw mode sends: keys, escape sequences cut by a read, and a
bracketed paste whose newlines are text."""
from __future__ import annotations

from engine.terminal_keys import BACKSPACE, CLEAR, END, ENTER, PASTE_ENDS, PASTE_STARTS, Key, KeyDecoder


def test_typed_keys_and_control_keys():
    keys = KeyDecoder().feed(b"hi\x7f!\r\x0c\x04")
    assert keys == [Key("text", "hi"), BACKSPACE, Key("text", "!"), ENTER, CLEAR, END]


def test_a_paste_is_text_newlines_included_and_its_markers_may_be_cut_by_reads():
    decoder = KeyDecoder()
    keys = decoder.feed(b"\x1b[20") + decoder.feed(b"0~one\rtwo\n") + decoder.feed(b"three\x1b[2") + decoder.feed(b"01~\r")
    assert keys == [PASTE_STARTS, Key("text", "one\ntwo\n"), Key("text", "three"), PASTE_ENDS, ENTER]


def test_arrows_and_alt_keys_are_dropped_and_utf8_cut_by_a_read_is_kept_whole():
    decoder = KeyDecoder()
    snowman = "☃".encode()
    keys = decoder.feed(b"a\x1b[A\x1bOB\x1bx" + snowman[:1]) + decoder.feed(snowman[1:] + b"b")
    assert keys == [Key("text", "a"), Key("text", "☃b")]
