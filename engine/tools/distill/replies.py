"""What a reply writer is given and gives back (`writer.BatchReplyWriter`, over whichever
runtime's sequence batch), and how a running reply's next token is drawn."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
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


# Replies are drawn from the target's SAMPLED_TOP_K most likely tokens only: a softmax and a
# draw over the whole 49k-token vocabulary per row cost more than a decode on the CPU. At the
# temperatures used for data (0.7-1.0) those tokens hold all but a sliver of the probability;
# `Reply.sampled_mass` records how much.
SAMPLED_TOP_K = 64


@dataclass
class RunningReply:
    """A reply being written: its job and what it has so far."""

    job: Job
    reply: list[int] = field(default_factory=list)
    top_ids: list[torch.Tensor] = field(default_factory=list)
    top_logprobs: list[torch.Tensor] = field(default_factory=list)
    mass: float = 0.0

    def add(self, token: int, stop_ids: frozenset[int], max_new_tokens: int) -> Reply | None:
        """Append the next token; the finished reply when it ended the reply, else None."""
        self.reply.append(token)
        if token in stop_ids or len(self.reply) == max_new_tokens:
            return finished_reply(self, stopped=token in stop_ids)
        return None


def check_prompt_fits(prompt_ids: list[int], sequence_tokens: int, max_new_tokens: int) -> None:
    if not 0 < len(prompt_ids) <= sequence_tokens - max_new_tokens:
        raise ValueError(f"a prompt of {len(prompt_ids)} tokens does not fit a {sequence_tokens}-token sequence with {max_new_tokens} new tokens")


def sample_next(logits: torch.Tensor, states: list[RunningReply], temperature: float, stored_top_k: int) -> list[int]:
    """Each row's next token for its reply (row i: states[i]), drawn from the row's top
    SAMPLED_TOP_K with the reply's own generator; records the row's top-k log-probs. The
    logits may lie on a GPU: only the candidates come to the host, where the generators are."""
    best = torch.topk(logits, min(max(SAMPLED_TOP_K, stored_top_k), logits.shape[-1]), dim=-1)
    indices = best.indices.cpu()
    logprobs = (best.values - torch.logsumexp(logits, dim=-1, keepdim=True)).cpu()
    # The stored top-k converted for all rows at once rather than a few tensor ops per row.
    top_ids = indices[:, :stored_top_k].to(torch.int32).unbind(0)
    top_logprobs = logprobs[:, :stored_top_k].to(torch.float16).unbind(0)
    if temperature > 0:
        tempered = torch.softmax(best.values / temperature, dim=-1).cpu()
        # what the candidates hold of the whole tempered distribution
        masses = torch.exp(best.values / temperature - torch.logsumexp(logits / temperature, dim=-1, keepdim=True)).sum(-1).tolist()
        picks = [int(torch.multinomial(tempered[row], 1, generator=state.job.generator)) for row, state in enumerate(states)]
    else:
        masses, picks = [1.0] * len(states), [0] * len(states)
    candidates = indices.tolist()
    tokens = []
    for row, state in enumerate(states):
        state.mass += masses[row]
        tokens.append(candidates[row][picks[row]])
        if stored_top_k:
            state.top_ids.append(top_ids[row])
            state.top_logprobs.append(top_logprobs[row])
    return tokens


def finished_reply(state: RunningReply, stopped: bool) -> Reply:
    empty = torch.empty((len(state.reply), 0))
    return Reply(
        key=state.job.key,
        prompt_ids=state.job.prompt_ids,
        reply_ids=state.reply,
        top_ids=torch.stack(state.top_ids) if state.top_ids else empty.to(torch.int32),
        top_logprobs=torch.stack(state.top_logprobs) if state.top_logprobs else empty.to(torch.float16),
        stopped=stopped,
        sampled_mass=state.mass / max(len(state.reply), 1),
    )
