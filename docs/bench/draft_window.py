"""What reading only a long prompt's end costs the draft and saves the user: the demo pair,
long messages made of this project's own docs, each reply written twice in one process,
once with the draft's window (engine/runtime/windowed.py) and once with the draft reading
everything, in alternating order. Greedy, so both replies must be the same tokens (the
target alone decides them); the script stops if they are not.

    TANDEM_THREADS=2 .venv/bin/python docs/bench/draft_window.py [TOKENS ...] [--methods chain,tree]

First the draft alone, per message size: its read of the prompt and one call after it (a
draft token), each way. Then per message size and method: the first token's time, the reply's
tokens a second after its first token, and the tokens each target call kept, both ways.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from engine.chat_prompt import Message, build_prompt
from engine.config import DecodeSettings
from engine.events import Finished
from engine.pairs import find_pair
from engine.runtime.windowed import DRAFT_WINDOW_TOKENS
from engine.session import load_pair

DOCS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
QUESTION = "Summarize this text in two sentences: "
EVERYTHING = 10**9  # a window no prompt reaches: the draft reads all of it


def message_of(tokenizer, tokens: int) -> str:
    """About `tokens` tokens of the benchmarks page on one line, after the question."""
    text = " ".join(re.sub(r"[|#*`]", " ", DOCS.read_text(encoding="utf-8")).split())
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return QUESTION + tokenizer.decode(ids)


def reply(pair, message: str, method: str, window: int, new_tokens: int) -> Finished:
    pair.reset_caches()
    pair.draft_runner.window = window
    settings = DecodeSettings(method=method, max_new_tokens=new_tokens, temperature=0.0)
    return [event for event in pair.generate([Message("user", message)], settings) if isinstance(event, Finished)][-1]


def alternating(repeats: int):
    """The two ways of reading, `repeats` times each, the first of each pair taking turns."""
    for repeat in range(repeats):
        yield from (DRAFT_WINDOW_TOKENS, EVERYTHING) if repeat % 2 == 0 else (EVERYTHING, DRAFT_WINDOW_TOKENS)


def draft_alone(pair, message: str, window: int) -> tuple[float, float]:
    """Seconds the draft takes to read the prompt `message` makes (all but its last token),
    and milliseconds of one draft call after it (the median of 5)."""
    draft = pair.draft_runner
    context = build_prompt(pair.tokenizer, [Message("user", message)], None, pair.context_length).token_ids
    draft.reset()
    draft.window = window
    started = time.perf_counter()
    draft.catch_up(context)
    read = time.perf_counter() - started
    calls = []
    for _ in range(5):
        started = time.perf_counter()
        draft.forward(context[-1:])
        calls.append(1000 * (time.perf_counter() - started))
        draft.crop(len(context) - 1)
    draft.reset()
    return read, statistics.median(calls)


def figures(finished: Finished) -> tuple[float, float, float]:
    stats = finished.stats
    after_first = stats.elapsed_s - stats.time_to_first_token_s
    return stats.time_to_first_token_s, (stats.tokens_generated - 1) / after_first, stats.tokens_generated / stats.target_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", nargs="*", type=int, default=[2000, 7000])
    parser.add_argument("--methods", default="chain,tree")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    pair = load_pair(find_pair("demo"))
    print(f"draft window {DRAFT_WINDOW_TOKENS} tokens; medians of {args.repeats}, the two ways alternating")
    print("| message tokens | the draft's read, window / everything (s) | a draft call after it (ms) |")
    print("|---|---|---|")
    for tokens in args.tokens:
        message = message_of(pair.tokenizer, tokens)
        runs: dict[int, list[tuple[float, float]]] = {DRAFT_WINDOW_TOKENS: [], EVERYTHING: []}
        for window in alternating(args.repeats):
            runs[window].append(draft_alone(pair, message, window))
        (read_w, call_w), (read_e, call_e) = ([statistics.median(run[i] for run in runs[w]) for i in range(2)] for w in runs)
        print(f"| {tokens:,} | {read_w:.2f} / {read_e:.2f} | {call_w:.2f} / {call_e:.2f} |", flush=True)
    print(f"\nGreedy replies of {args.new_tokens} tokens")
    print("| message tokens | method | first token, window / everything (s) | tok/s after it | tokens per target call |")
    print("|---|---|---|---|---|")
    reply(pair, message_of(pair.tokenizer, 300), "chain", DRAFT_WINDOW_TOKENS, 8)  # warm-up
    for tokens in args.tokens:
        message = message_of(pair.tokenizer, tokens)
        for method in args.methods.split(","):
            runs: dict[int, list[tuple[float, float, float]]] = {DRAFT_WINDOW_TOKENS: [], EVERYTHING: []}
            written = set()
            for window in alternating(args.repeats):
                finished = reply(pair, message, method, window, args.new_tokens)
                written.add(finished.token_ids)
                runs[window].append(figures(finished))
            if len(written) != 1:
                raise SystemExit(f"{method} at {tokens} tokens wrote different replies: greedy decoding must not depend on the draft")
            windowed, everything = ([statistics.median(run[i] for run in runs[w]) for i in range(3)] for w in runs)
            print(f"| {finished.stats.prompt_tokens:,} | {method} | {windowed[0]:.2f} / {everything[0]:.2f} "
                  f"| {windowed[1]:.1f} / {everything[1]:.1f} | {windowed[2]:.2f} / {everything[2]:.2f} |", flush=True)
    pair.close()


if __name__ == "__main__":
    main()
