"""Stop strings over streamed text: cut before the first, even when it arrives in pieces;
text that only looked like the start of one is sent once it is clear it is not."""
from __future__ import annotations

from engine.serve.stop_strings import StopStrings


def test_a_stop_string_split_across_deltas_ends_the_text_before_it():
    stops = StopStrings(["world"])
    assert stops.feed("Hello wo") == "Hello "  # "wo" may begin the stop string: held back
    assert stops.feed("rld, and more") == ""
    assert stops.stopped
    assert stops.feed("ignored") == "" and stops.flush() == ""


def test_text_held_back_is_sent_once_it_cannot_be_a_stop_string():
    stops = StopStrings(["</end>"])
    assert stops.feed("a </") == "a "
    assert stops.feed("b") == "</b"
    assert stops.feed(" </en") == " "
    assert stops.flush() == "</en"  # the reply ended: what was held back was text after all
    assert not stops.stopped


def test_the_earliest_of_several_stop_strings_wins():
    stops = StopStrings(["STOP", "\n\n"])
    assert stops.feed("one\n\ntwo STOP") == "one"


def test_without_stop_strings_text_passes_through():
    stops = StopStrings([])
    assert stops.feed("any text") == "any text"
    assert stops.flush() == ""
