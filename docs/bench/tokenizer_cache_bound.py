"""Whether the tokenizer's word cache is bounded: encode 800,000 distinct random words through a
model's tokenizer and print the C heap's blocks in use (engine/heap.py) after each 100,000.

    .venv/bin/python docs/bench/tokenizer_cache_bound.py resources/drafts/smollm2-135m-draft

`tandem soak` saw the heap in use grow ~1.3 MB per 100 replies; heaptrack put most of it in the
tokenizers library's BPE word cache. A cache that stops growing here is not a leak."""
from __future__ import annotations

import random
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import AutoTokenizer  # noqa: E402

from engine import heap  # noqa: E402


def random_word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 12)))


def main(model_folder: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    rng = random.Random(0)
    start = heap.in_use_bytes()
    if start is None:
        sys.exit("the C heap's count is glibc's (mallinfo2): not available here")
    for hundred_thousands in range(1, 9):
        for _ in range(25_000):
            tokenizer.encode(" ".join(random_word(rng) for _ in range(4)))
        print(f"{hundred_thousands * 100_000:,} distinct words: heap in use +{(heap.in_use_bytes() - start) / 2**20:.1f} MB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
