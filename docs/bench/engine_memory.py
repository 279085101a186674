"""Resident memory over many replies through the engine alone: no Qt, no chat store, so what
grows here is the engine's. The demo pair, methods rotating with `auto` every second reply at
T = 0.7 (the soak's plan), conversations of four replies, every fifth reply stopped after its
first text; with SWITCH=N the pair changes every N replies between the demo pair and the same
target drafting by n-gram lookup, the new one loaded before the old one is closed, as the app
does.

    [SWITCH=10] TANDEM_THREADS=2 .venv/bin/python docs/bench/engine_memory.py REPLIES

Prints the resident memory every 25 replies.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time

import psutil

from engine.chat_prompt import Message
from engine.config import VERIFIERS, DecodeSettings
from engine.events import Finished, TextDelta
from engine.pairs import find_pair
from engine.prompts import CHAT_PROMPTS, read_prompts
from engine.session import load_pair


def main() -> None:
    replies = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    switch_every = int(os.environ.get("SWITCH", "0"))
    demo = find_pair("demo")
    configs = [demo, dataclasses.replace(demo, name="demo n-gram", draft=None, eagle=None)]
    pair = load_pair(configs[0])
    prompts = read_prompts(CHAT_PROMPTS)
    process = psutil.Process()
    started = time.time()
    history: list[Message] = []
    for index in range(replies):
        if switch_every and index and index % switch_every == 0:
            loaded = load_pair(configs[(index // switch_every) % 2])
            pair.close()
            pair = loaded
        others = [name for name in pair.methods if name != "auto"] or ["auto"]
        method = "auto" if index % 2 == 0 else others[(index // 2) % len(others)]
        verifier = VERIFIERS[(index // len(pair.methods)) % len(VERIFIERS)]
        if index % 4 == 0:
            history = []
        history.append(Message("user", prompts[index % len(prompts)]))
        generation = pair.generate(history, DecodeSettings(method=method, temperature=0.7, max_new_tokens=64, verifier=verifier))
        text = ""
        for event in generation:
            if isinstance(event, TextDelta) and index % 5 == 4:
                generation.stop()
            if isinstance(event, Finished):
                text = event.text
        history.append(Message("assistant", text))
        if index % 25 == 24:
            resident = process.memory_info().rss / 2**20
            print(f"{index + 1} replies ({pair.config.name}): {resident:.1f} MB resident, {time.time() - started:.0f} s", flush=True)
    pair.close()


if __name__ == "__main__":
    main()
