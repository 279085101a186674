"""OpenAI's response shapes for both endpoints, whole and as server-sent-event chunks, each
with the engine's figures of the reply as `timings` (named as llama.cpp's server names them
where it has a name for one, Tandem's own beside them):

    "timings": {"prompt_n": 31, "predicted_n": 64, "predicted_ms": 270.1, "predicted_per_second": 236.9,
                "draft_n": 80, "draft_n_accepted": 51, "tokens_per_target_call": 2.4, "approximate": false, ...}

A stream ends as OpenAI's does: a chunk with the finish reason (and here the timings), a
chunk with the usage if `stream_options.include_usage` asked for it, then `data: [DONE]`.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .. import methods
from ..stats import GenerationStats
from .requests import CompletionRequest
from .work_queue import Done, Failed, Job, Prepared, Text


@dataclass(frozen=True)
class Shape:
    """What differs between the chat and the plain completion responses."""

    id_prefix: str
    whole_object: str
    chunk_object: str
    chat: bool

    def choice(self, text: str, finish_reason: str) -> dict:
        if self.chat:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason, "logprobs": None}
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}

    def chunk_choice(self, delta: dict, finish_reason: str | None) -> dict:
        if self.chat:
            return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return {"index": 0, "text": delta.get("content", ""), "finish_reason": finish_reason, "logprobs": None}


CHAT = Shape("chatcmpl-", "chat.completion", "chat.completion.chunk", chat=True)
COMPLETION = Shape("cmpl-", "text_completion", "text_completion", chat=False)


def whole_response(shape: Shape, prepared: Prepared, text: str, done: Done) -> dict:
    return {
        **_header(shape, shape.whole_object, prepared.model),
        "choices": [shape.choice(text, done.finish_reason)],
        "usage": usage(done.stats),
        "timings": timings(done),
    }


async def event_stream(shape: Shape, request: CompletionRequest, prepared: Prepared, job: Job) -> AsyncIterator[str]:
    """The reply as server-sent events, from its prompt on (the stream's response cancels
    the job if the client leaves: engine/serve/app.py's JobStream)."""
    header = _header(shape, shape.chunk_object, prepared.model)
    if shape.chat:
        yield _event({**header, "choices": [shape.chunk_choice({"role": "assistant", "content": ""}, None)]})
    while True:
        event = await job.next_event()
        if isinstance(event, Text):
            yield _event({**header, "choices": [shape.chunk_choice({"content": event.text}, None)]})
        elif isinstance(event, Done):
            yield _event({**header, "choices": [shape.chunk_choice({}, event.finish_reason)], "timings": timings(event)})
            if request.include_usage:
                yield _event({**header, "choices": [], "usage": usage(event.stats)})
            yield "data: [DONE]\n\n"
            return
        elif isinstance(event, Failed):  # after the 200 went out: the error is the stream's last event
            yield _event(event.error.to_json())
            return


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens_generated,
        "total_tokens": stats.prompt_tokens + stats.tokens_generated,
    }


def timings(done: Done) -> dict:
    stats = done.stats
    return {
        "prompt_n": stats.prompt_tokens,
        "predicted_n": stats.tokens_generated,
        # From the start of the reply, reading the prompt included: the tok/s the app and `tandem bench` show.
        "predicted_ms": stats.elapsed_s * 1000,
        "predicted_per_second": stats.tokens_per_s,
        "first_token_ms": stats.time_to_first_token_s * 1000 if stats.time_to_first_token_s is not None else None,
        "queue_ms": done.queue_s * 1000,
        "draft_n": stats.draft_tokens_proposed,
        "draft_n_accepted": stats.draft_tokens_accepted,
        "target_calls": stats.target_calls,
        "tokens_per_target_call": stats.mean_accepted_per_target_call,
        "method": methods.label(stats.method),
        "rounds_by_method": dict(stats.rounds_by_method),
        # SPRINTER: tokens went out that the target never checked.
        "approximate": not stats.exact,
        "unchecked_tokens": stats.unchecked_tokens,
    }


def _header(shape: Shape, object_name: str, model: str) -> dict:
    return {"id": f"{shape.id_prefix}{uuid.uuid4().hex}", "object": object_name, "created": int(time.time()), "model": model}


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
