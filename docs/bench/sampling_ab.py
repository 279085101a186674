"""Sampled replies of the demo pair with the sampler before and after its speed-up, in one
process (issue 21): the draw by torch.multinomial and top-p by sorting the vocabulary (as
engine/sampling.py had them, reproduced below) against the current ones, alternating, 6
replies of up to 128 tokens at T = 0.7 with plain decoding, twice each.

  .venv/bin/python docs/bench/sampling_ab.py
"""
from __future__ import annotations

import statistics
import time

import torch

from engine import sampling
from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.pairs import find_pair
from engine.prompts import CHAT_PROMPTS, read_prompts
from engine.session import load_pair

REPLIES = 6


def multinomial_draw(self: sampling.Sampler, probs: torch.Tensor) -> int:
    return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))


def sorted_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def main() -> None:
    pair = load_pair(find_pair("demo"), lambda message, fraction: None)
    prompts = read_prompts(CHAT_PROMPTS)[:REPLIES]
    samplers = {"before": (multinomial_draw, sorted_top_p), "after": (sampling.Sampler.draw, sampling._keep_top_p)}

    def tokens_per_s(top_p: float) -> float:
        tokens, started = 0, time.perf_counter()
        for index, prompt in enumerate(prompts):
            pair.reset_caches()
            settings = DecodeSettings(method="ar", max_new_tokens=128, temperature=0.7, top_p=top_p, seed=index)
            for event in pair.generate([Message("user", prompt)], settings):
                if type(event).__name__ == "Finished":
                    tokens += len(event.token_ids)
        return tokens / (time.perf_counter() - started)

    for top_p in (1.0, 0.9):
        rates: dict[str, list[float]] = {name: [] for name in samplers}
        for _ in range(2):
            for name, (draw, keep_top_p) in samplers.items():
                sampling.Sampler.draw, sampling._keep_top_p = draw, keep_top_p
                rates[name].append(tokens_per_s(top_p))
        before, after = statistics.mean(rates["before"]), statistics.mean(rates["after"])
        print(f"T = 0.7, top-p {top_p}: before {before:.1f} tok/s, after {after:.1f} tok/s ({after / before:.2f}x)", flush=True)
    sampling.Sampler.draw, sampling._keep_top_p = samplers["after"]


if __name__ == "__main__":
    main()
