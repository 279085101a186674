"""The window's reading-time estimate against the real reading: the demo pair reads a message
of the first size, the app's ReadingClock fits its cost from the chunks' times as the window
does (app/reading_time.py), and then tells how long each other size will take; those are read
and timed. Also what a single speed in tokens/s (the estimate before) would have told.

    TANDEM_THREADS=2 .venv/bin/python docs/bench/reading_estimate.py [--method ar] 2000 4000 7000
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.reading_time import ReadingClock, ReadingCost
from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.events import PromptProgress, PromptPrepared
from engine.pairs import find_pair
from engine.session import load_pair

sys.path.insert(0, str(Path(__file__).parent))
from draft_window import message_of  # noqa: E402  (a script beside this one)


def read(pair, message: str, method: str) -> tuple[ReadingClock, int, float]:
    """The reading's clock, the prompt's tokens and the seconds to the first token."""
    pair.reset_caches()
    clock, tokens, started = ReadingClock(), 0, time.monotonic()
    for event in pair.generate([Message("user", message)], DecodeSettings(method=method, max_new_tokens=1)):
        if isinstance(event, PromptPrepared):
            tokens = event.prompt_tokens
        elif isinstance(event, PromptProgress):
            clock.add(event, time.monotonic())
    return clock, tokens, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", nargs="+", type=int)
    parser.add_argument("--method", default="ar")
    args = parser.parse_args()
    pair = load_pair(find_pair("demo"))
    read(pair, message_of(pair.tokenizer, 600), args.method)  # warm-up
    first = message_of(pair.tokenizer, args.tokens[0])
    clock, tokens, seconds = read(pair, first, args.method)
    cost = ReadingCost(*clock.cost(), chars_per_token=len(first) / tokens)
    print(f"measured on {tokens:,} tokens ({seconds:.2f} s to the first token): {1000 * cost.seconds_per_token:.3f} ms a token "
          f"+ {1e6 * cost.seconds_per_token_seen:.4f} µs per token attended to")
    print("| message tokens | estimate from its length (s) | one speed's estimate (s) | first token (s) |")
    print("|---|---|---|---|")
    for size in args.tokens[1:]:
        message = message_of(pair.tokenizer, size)
        estimate = cost.seconds_for(len(message))
        linear = len(message) / len(first) * seconds
        _, tokens, took = read(pair, message, args.method)
        print(f"| {tokens:,} | {estimate:.1f} | {linear:.1f} | {took:.1f} |", flush=True)
    pair.close()


if __name__ == "__main__":
    main()
