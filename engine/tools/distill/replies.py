"""What a reply writer is given and gives back, whichever runtime writes the replies
(`data.TorchBatchWriter`, `llamacpp_batch.LlamaCppBatchWriter`)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Job:
    """One reply to write: `key` names it to the caller; its own random stream makes the
    reply independent of which other replies happen to share its forwards."""

    key: int
    prompt_ids: list[int]
    generator: torch.Generator


@dataclass
class Reply:
    key: int
    prompt_ids: list[int]
    reply_ids: list[int]
    top_ids: torch.Tensor  # (L, k) int32: the target's best k tokens before each reply token
    top_logprobs: torch.Tensor  # (L, k) float16, at temperature 1
    stopped: bool  # ended with a stop token (False: cut at max_new_tokens)
    sampled_mass: float  # mean probability the sampled-from tokens held at the sampling temperature


class ReplyWriter(Protocol):
    sequence_tokens: int  # prompt + reply tokens one sequence may hold

    def write(
        self,
        jobs: Iterable[Job],
        max_new_tokens: int,
        temperature: float,
        stored_top_k: int,
        stop_ids: frozenset[int],
        should_stop: Callable[[], bool] = ...,
    ) -> Iterator[Reply]:
        """Yield a reply per job as each ends (in any order); stopping drops unfinished ones."""
        ...

    def close(self) -> None: ...
